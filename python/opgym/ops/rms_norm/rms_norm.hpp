// What opgym::rms_norm's CPU binding (rms_norm.cpp: schemas, CPU, Meta, Autograd kernels) and its CUDA
// binding (rms_norm_cuda.cpp) share: the checks that need no data (the Meta kernels run them too, so
// fake tensors raise what real ones do) and the core's options from the operator's arguments.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <string_view>

#include "csrc/torch_common.hpp"
#include "opgym/rms_norm.hpp"

namespace opgym_torch {
// Every op's binding is linked into one library: names here carry the op's (two inline functions of
// one signature in two ops' headers would be one function, silently).

// Layout, dtype, rank, weight's shape and device, mode, eps. Returns the output dtype.
inline at::ScalarType check_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                                     c10::string_view mode) {
  TORCH_CHECK_VALUE(x.defined(), "opgym::rms_norm: x is undefined");
  TORCH_CHECK_VALUE(weight.defined(), "opgym::rms_norm: weight is undefined");
  TORCH_CHECK_VALUE(x.layout() == at::kStrided, "opgym::rms_norm: x must be a strided (dense) tensor, got layout ", x.layout());
  TORCH_CHECK_VALUE(weight.layout() == at::kStrided, "opgym::rms_norm: weight must be a strided (dense) tensor, got layout ",
                    weight.layout());
  const opgym::DType xd = to_opgym_dtype(x.scalar_type(), "x", "rms_norm");
  const opgym::DType wd = to_opgym_dtype(weight.scalar_type(), "weight", "rms_norm");
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.dim() <= opgym::kMaxRank, "opgym::rms_norm: x must have 1 to ", opgym::kMaxRank,
                    " dims, got ", x.dim());
  TORCH_CHECK_VALUE(weight.dim() == 1, "opgym::rms_norm: weight must be 1-D of size ", x.sym_size(-1),
                    " (the last dim of x), got shape ", weight.sym_sizes());
  TORCH_SYM_CHECK(weight.sym_size(0).sym_eq(x.sym_size(-1)), "opgym::rms_norm: weight must have shape [", x.sym_size(-1),
                  "] (the last dim of x), got ", weight.sym_sizes());
  TORCH_CHECK_VALUE(mode == "hf" || mode == "fp32", "opgym::rms_norm: mode must be 'hf' or 'fp32', got '", mode, "'");
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "opgym::rms_norm: eps must be a finite number >= 0, got ", eps);
  return to_aten_dtype(opgym::rms_norm_out_dtype(xd, wd));
}

inline void check_rms_norm_weight_device(const at::Tensor& x, const at::Tensor& weight) {
  check_device(weight, "weight", x, "x", "rms_norm");
}

// The out form's checks beyond check_rms_norm (real and Meta kernels): device, the promoted dtype, x's shape.
inline void check_rms_norm_out(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& out,
                               at::ScalarType out_dtype) {
  check_rms_norm_weight_device(x, weight);
  check_device(out, "out", x, "x", "rms_norm");
  TORCH_CHECK_VALUE(out.scalar_type() == out_dtype, "opgym::rms_norm_out: out must have dtype ", out_dtype,
                    " (torch's promotion of weight ", weight.scalar_type(), " and x ", x.scalar_type(), "), got ",
                    out.scalar_type());
  check_same_shape(out, "out", x, "x", "rms_norm_out");
}

// The in-place form's (real and Meta kernels): the output dtype must be x's own.
inline void check_rms_norm_in_place(const at::Tensor& x, const at::Tensor& weight, at::ScalarType out_dtype) {
  check_rms_norm_weight_device(x, weight);
  TORCH_CHECK_VALUE(out_dtype == x.scalar_type(), "opgym::rms_norm_: in place needs an output dtype equal to x's ",
                    x.scalar_type(), ", but weight ", weight.scalar_type(), " promotes it to ", out_dtype,
                    "; use opgym::rms_norm or rms_norm_out");
}

inline opgym::RmsNormOptions rms_norm_options(double eps, c10::string_view mode, bool weight_offset) {
  opgym::RmsNormOptions o;
  o.eps = eps;
  o.mode = opgym::parse_mode(std::string_view(mode.data(), mode.size()));
  o.weight_offset = weight_offset;
  return o;
}

}  // namespace opgym_torch
