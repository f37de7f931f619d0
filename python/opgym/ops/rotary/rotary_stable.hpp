// opgym::rotary's argument checks, options and functional outputs on torch's stable ABI, shared by its CPU
// kernels (rotary.cpp) and CUDA kernels (rotary_cuda.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"

namespace opgym_stable {

using RotarySection = std::optional<std::vector<int64_t>>;  // the schema's int[]? mrope_section

inline std::string rotary_section_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// Checks that need no data; the core checks the rest (broadcast, overlap) before writing anything.
inline void check_rotary(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                         const std::string& mode, const RotarySection& mrope_section, const std::string& pairs,
                         const char* op) {
  check_tensor_arg(q, "q", op);
  check_tensor_arg(k, "k", op);
  check_tensor_arg(cos, "cos", op);
  check_tensor_arg(sin, "sin", op);
  OPGYM_CHECK_VALUE(mode == "hf" || mode == "fp32", "opgym::", op, ": mode must be 'hf' or 'fp32', got '", mode, "'");
  OPGYM_CHECK_VALUE(pairs == "half" || pairs == "interleaved" || pairs == "deinterleave", "opgym::", op,
                    ": pairs must be 'half', 'interleaved' or 'deinterleave', got '", pairs, "'");
  OPGYM_CHECK_VALUE(k.scalar_type() == q.scalar_type(), "opgym::", op, ": k must have q's dtype ",
                    dtype_name(q.scalar_type()), ", got ", dtype_name(k.scalar_type()));
  OPGYM_CHECK_VALUE(q.dim() >= 2 && q.dim() <= opgym::kMaxRank && k.dim() == q.dim(), "opgym::", op,
                    ": q and k must have one rank from 2 to ", opgym::kMaxRank, ", got ", sizes_of(q), " and ",
                    sizes_of(k));
  if (mode == "hf")
    OPGYM_CHECK_VALUE(cos.scalar_type() == q.scalar_type() && sin.scalar_type() == q.scalar_type(), "opgym::", op,
                      ": mode hf computes in q's dtype: cos and sin must be ", dtype_name(q.scalar_type()), ", got ",
                      dtype_name(cos.scalar_type()), " and ", dtype_name(sin.scalar_type()));
  if (mrope_section.has_value())
    OPGYM_CHECK_VALUE(mrope_section->size() == 3, "opgym::", op, ": mrope_section must hold three lengths, got ",
                      rotary_section_text(*mrope_section));
  OPGYM_CHECK_VALUE(k.size(-1) == q.size(-1), "opgym::", op, ": k must have q's last dim ", q.size(-1), ", got ",
                    sizes_of(k));
  check_device(k, "k", q, "q", op);
  check_device(cos, "cos", q, "q", op);
  check_device(sin, "sin", q, "q", op);
}

inline opgym::RotaryOptions rotary_options(int64_t unsqueeze_dim, const std::string& mode,
                                           const RotarySection& mrope_section, const std::string& pairs,
                                           bool pair_table) {
  opgym::RotaryOptions o;
  o.mode = opgym::parse_rotary_mode(mode);
  o.pairs = opgym::parse_rotary_pairs(pairs);
  o.pair_table = pair_table;
  OPGYM_CHECK_VALUE(unsqueeze_dim >= -opgym::kMaxRank && unsqueeze_dim < opgym::kMaxRank,
                    "opgym::rotary: unsqueeze_dim out of range, got ", unsqueeze_dim);
  o.unsqueeze_dim = static_cast<int>(unsqueeze_dim);
  if (mrope_section.has_value())
    for (int i = 0; i < 3; ++i) o.mrope_section[i] = (*mrope_section)[i];
  return o;
}

// q's and k's own layout (empty_like: what HF's elementwise ops give), or fresh contiguous tensors
// (what HF's torch.cat gives: the partial and deinterleaving forms).
inline Tensor rotary_output(const Tensor& x, bool contiguous) {
  return contiguous ? torch::stable::empty(x.sizes(), x.scalar_type(), std::nullopt, x.device())
                    : torch::stable::empty_like(x);
}

}  // namespace opgym_stable
