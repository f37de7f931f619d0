// opgym::attn_softmax's argument checks and the inputs as the core takes them, on torch's stable ABI, shared by
// its CPU kernels (attn_softmax.cpp) and CUDA kernels (attn_softmax_cuda.cpp).
#pragma once

#include <optional>
#include <vector>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"

namespace opgym_stable {

// Checks that need no data; the core checks overlap before writing.
inline void check_attn_softmax(const Tensor& scores, const std::optional<Tensor>& mask, const char* op) {
  check_tensor_arg(scores, "scores", op);
  OPGYM_CHECK_VALUE(scores.dim() >= 1 && scores.dim() <= opgym::kMaxRank, "opgym::", op, ": scores must have rank 1 to ",
                    opgym::kMaxRank, ", got ", sizes_of(scores));
  if (!mask.has_value()) return;
  check_tensor_arg(*mask, "mask", op);
  check_device(*mask, "mask", scores, "scores", op);
  OPGYM_CHECK_VALUE(mask->scalar_type() == scores.scalar_type(), "opgym::", op, ": mask must have scores' dtype ",
                    dtype_name(scores.scalar_type()), " (HF adds it in that dtype; another would promote), got ",
                    dtype_name(mask->scalar_type()));
  bool ok = mask->dim() <= scores.dim();
  const int64_t lead = scores.dim() - mask->dim();
  for (int64_t d = 0; ok && d < mask->dim(); ++d) ok = mask->size(d) == 1 || mask->size(d) == scores.size(lead + d);
  OPGYM_CHECK_VALUE(ok, "opgym::", op, ": mask must broadcast to scores ", sizes_of(scores), ", got ", sizes_of(*mask));
}

// The mask as the core takes it: scores' rank (leading size-1 dims added), last dim as scores' and contiguous.
inline Tensor attn_softmax_core_mask(const Tensor& scores, const Tensor& mask) {
  std::vector<int64_t> shape(static_cast<size_t>(scores.dim() - mask.dim()), 1);
  for (const int64_t s : mask.sizes()) shape.push_back(s);
  Tensor m = torch::stable::view(mask, shape);
  if (m.size(-1) != scores.size(-1) || (m.size(-1) > 1 && m.stride(-1) != 1)) {
    shape.back() = scores.size(-1);
    m = torch::stable::contiguous(call_op("aten::expand", "", m, shape, false));
  }
  return m;
}

// A functional call reads any strided scores (a last dim that is not contiguous is copied first).
inline Tensor attn_softmax_readable(const Tensor& scores) {
  return scores.dim() == 0 || scores.size(-1) <= 1 || scores.stride(-1) == 1 ? scores
                                                                               : torch::stable::contiguous(scores);
}

}  // namespace opgym_stable
