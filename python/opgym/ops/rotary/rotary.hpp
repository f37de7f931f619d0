// What opgym::rotary's CPU binding (rotary.cpp: schemas, CPU, Meta, Autograd and ADInplaceOrView
// kernels) and its CUDA binding (rotary_cuda.cpp) share: the checks that need no data and the core's
// options. Names carry the op's: every op's binding is linked into one library.
#pragma once
#include <ATen/ATen.h>

#include <string_view>

#include "csrc/torch_common.hpp"
#include "opgym/rotary.hpp"

namespace opgym_torch {

// Checks that need no data (CPU, CUDA and Meta kernels); the core checks the rest (broadcast,
// overlap) before writing anything.
inline void check_rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                         c10::string_view mode, const c10::optional<at::IntArrayRef>& mrope_section,
                         c10::string_view pairs, const char* op) {
  check_tensor_arg(q, "q", op);
  check_tensor_arg(k, "k", op);
  check_tensor_arg(cos, "cos", op);
  check_tensor_arg(sin, "sin", op);
  TORCH_CHECK_VALUE(mode == "hf" || mode == "fp32", "opgym::", op, ": mode must be 'hf' or 'fp32', got '", mode, "'");
  TORCH_CHECK_VALUE(pairs == "half" || pairs == "interleaved" || pairs == "deinterleave", "opgym::", op,
                    ": pairs must be 'half', 'interleaved' or 'deinterleave', got '", pairs, "'");
  TORCH_CHECK_VALUE(k.scalar_type() == q.scalar_type(), "opgym::", op, ": k must have q's dtype ", q.scalar_type(),
                    ", got ", k.scalar_type());
  TORCH_CHECK_VALUE(q.dim() >= 2 && q.dim() <= opgym::kMaxRank && k.dim() == q.dim(), "opgym::", op,
                    ": q and k must have one rank from 2 to ", opgym::kMaxRank, ", got ", q.sym_sizes(), " and ",
                    k.sym_sizes());
  if (mode == "hf")
    TORCH_CHECK_VALUE(cos.scalar_type() == q.scalar_type() && sin.scalar_type() == q.scalar_type(), "opgym::", op,
                      ": mode hf computes in q's dtype: cos and sin must be ", q.scalar_type(), ", got ",
                      cos.scalar_type(), " and ", sin.scalar_type());
  if (mrope_section.has_value())
    TORCH_CHECK_VALUE(mrope_section->size() == 3, "opgym::", op, ": mrope_section must hold three lengths, got ",
                      *mrope_section);
  OPGYM_SYM_CHECK_VALUE(k.sym_size(-1).sym_eq(q.sym_size(-1)), "opgym::", op, ": k must have q's last dim ",
                        q.sym_size(-1), ", got ", k.sym_sizes());
  check_device(k, "k", q, "q", op);
  check_device(cos, "cos", q, "q", op);
  check_device(sin, "sin", q, "q", op);
}

inline opgym::RotaryOptions rotary_options(int64_t unsqueeze_dim, c10::string_view mode,
                                           const c10::optional<at::IntArrayRef>& mrope_section,
                                           c10::string_view pairs, bool pair_table) {
  opgym::RotaryOptions o;
  o.mode = opgym::parse_rotary_mode(std::string_view(mode.data(), mode.size()));
  o.pairs = opgym::parse_rotary_pairs(std::string_view(pairs.data(), pairs.size()));
  o.pair_table = pair_table;
  TORCH_CHECK_VALUE(unsqueeze_dim >= -opgym::kMaxRank && unsqueeze_dim < opgym::kMaxRank,
                    "opgym::rotary: unsqueeze_dim out of range, got ", unsqueeze_dim);
  o.unsqueeze_dim = static_cast<int>(unsqueeze_dim);
  if (mrope_section.has_value())
    for (int i = 0; i < 3; ++i) o.mrope_section[i] = (*mrope_section)[i];
  return o;
}

// The functional outputs: q's and k's own layout (empty_like: what HF's elementwise ops give), or
// fresh contiguous tensors (what HF's torch.cat gives: the partial and deinterleaving forms).
inline at::Tensor rotary_output(const at::Tensor& x, bool contiguous) {
  return contiguous ? at::empty_symint(x.sym_sizes(), x.options()) : at::empty_like(x);
}

}  // namespace opgym_torch
