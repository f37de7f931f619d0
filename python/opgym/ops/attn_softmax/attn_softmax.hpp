// opgym::attn_softmax's checks that need no data and the core's options from the operator's arguments, shared by
// the CPU and Meta kernels (attn_softmax.cpp) and the CUDA kernels (attn_softmax_cuda.cpp): fake tensors raise
// what real ones do. Inline and named after the op (every op's binding is linked into one library).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "csrc/torch_common.hpp"
#include "opgym/attn_softmax.hpp"

namespace opgym_torch {

// Checks that need no data (CPU, Meta and CUDA kernels); the core checks overlap before writing.
inline void check_attn_softmax(const at::Tensor& scores, const c10::optional<at::Tensor>& mask, const char* op) {
  check_tensor_arg(scores, "scores", op);
  TORCH_CHECK_VALUE(scores.dim() >= 1 && scores.dim() <= opgym::kMaxRank, "opgym::", op, ": scores must have rank 1 to ",
                    opgym::kMaxRank, ", got ", scores.sym_sizes());
  if (!mask.has_value()) return;
  check_tensor_arg(*mask, "mask", op);
  check_device(*mask, "mask", scores, "scores", op);
  TORCH_CHECK_VALUE(mask->scalar_type() == scores.scalar_type(), "opgym::", op, ": mask must have scores' dtype ",
                    scores.scalar_type(), " (HF adds it in that dtype; another would promote), got ", mask->scalar_type());
  TORCH_CHECK_VALUE(mask->dim() <= scores.dim(), "opgym::", op, ": mask must broadcast to scores ", scores.sym_sizes(),
                    ", got ", mask->sym_sizes());
  const int64_t lead = scores.dim() - mask->dim();
  for (int64_t d = 0; d < mask->dim(); ++d) {
    const c10::SymInt& m = mask->sym_size(d);
    OPGYM_SYM_CHECK_VALUE(m.sym_eq(1).sym_or(m.sym_eq(scores.sym_size(lead + d))), "opgym::", op,
                          ": mask must broadcast to scores ", scores.sym_sizes(), ", got ", mask->sym_sizes());
  }
}

inline void check_attn_softmax_segments(const at::Tensor& scores, const at::Tensor& cu, const char* op) {
  check_tensor_arg(scores, "scores", op);
  TORCH_CHECK_VALUE(scores.dim() >= 2 && scores.dim() <= opgym::kMaxRank, "opgym::", op,
                    ": scores must be [..., P, W] (rank 2 to ", opgym::kMaxRank, "), got ", scores.sym_sizes());
  TORCH_CHECK_VALUE(cu.defined() && cu.dim() == 1 && (cu.scalar_type() == at::kInt || cu.scalar_type() == at::kLong),
                    "opgym::", op, ": cu_seqlens must be a 1-D int32 or int64 tensor");
}

inline opgym::AttnSoftmaxOptions attn_softmax_options(double scale) {
  // The build torch runs (fixed for the process): its softmax's lane order and exp.
  static const opgym::CpuIsa torch_isa = [] {
    const std::string c = at::get_cpu_capability();
    return c == "AVX512" ? opgym::CpuIsa::avx512 : c == "AVX2" ? opgym::CpuIsa::avx2 : opgym::CpuIsa::scalar;
  }();
  opgym::AttnSoftmaxOptions o;
  o.scale = static_cast<float>(scale);  // what torch's mul does with a Python float
  o.torch_isa = torch_isa;
  return o;
}

// The mask as the core takes it: scores' rank (leading size-1 dims added), last dim as scores' and contiguous.
inline at::Tensor attn_softmax_core_mask(const at::Tensor& scores, const at::Tensor& mask) {
  std::vector<int64_t> shape(static_cast<size_t>(scores.dim() - mask.dim()), 1);
  shape.insert(shape.end(), mask.sizes().begin(), mask.sizes().end());
  at::Tensor m = mask.view(shape);
  if (m.size(-1) != scores.size(-1) || (m.size(-1) > 1 && m.stride(-1) != 1)) {
    shape.back() = scores.size(-1);
    m = m.expand(shape).contiguous();
  }
  return m;
}

}  // namespace opgym_torch
