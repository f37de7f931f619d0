// What opgym::add_rms_norm's CPU binding (add_rms_norm.cpp: schemas, CPU, Meta, Autograd and
// ADInplaceOrView kernels) and its CUDA binding (add_rms_norm_cuda.cpp) share: the checks that need no
// data and the core's options. Names carry the op's: every op's binding is linked into one library.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <string_view>

#include "csrc/torch_common.hpp"
#include "opgym/add_rms_norm.hpp"
#include "opgym/rms_norm.hpp"

namespace opgym_torch {

// Checks that need no data (CPU, CUDA and Meta kernels): returns the normalized output's dtype.
inline at::ScalarType check_add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                         double eps, c10::string_view mode, const char* op) {
  check_tensor_arg(x, "x", op);
  check_tensor_arg(residual, "residual", op);
  const opgym::DType xd = to_opgym_dtype(x.scalar_type(), "x", op);
  const opgym::DType wd = check_tensor_arg(weight, "weight", op);
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.dim() <= opgym::kMaxRank, "opgym::", op, ": x must have 1 to ", opgym::kMaxRank,
                    " dims, got ", x.dim());
  TORCH_CHECK_VALUE(residual.scalar_type() == x.scalar_type(), "opgym::", op, ": residual must have dtype ",
                    x.scalar_type(), " (x's: HF adds the residual in the activations' dtype), got ",
                    residual.scalar_type());
  check_same_shape(residual, "residual", x, "x", op);
  TORCH_CHECK_VALUE(weight.dim() == 1, "opgym::", op, ": weight must be 1-D of size ", x.sym_size(-1),
                    " (the last dim of x), got shape ", weight.sym_sizes());
  OPGYM_SYM_CHECK_VALUE(weight.sym_size(0).sym_eq(x.sym_size(-1)), "opgym::", op, ": weight must have shape [",
                        x.sym_size(-1), "] (the last dim of x), got ", weight.sym_sizes());
  TORCH_CHECK_VALUE(mode == "hf" || mode == "fp32", "opgym::", op, ": mode must be 'hf' or 'fp32', got '", mode, "'");
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "opgym::", op, ": eps must be a finite number >= 0, got ", eps);
  check_device(residual, "residual", x, "x", op);
  check_device(weight, "weight", x, "x", op);
  return to_aten_dtype(opgym::rms_norm_out_dtype(xd, wd));
}

inline opgym::RmsNormOptions add_rms_norm_options(double eps, c10::string_view mode, bool weight_offset) {
  opgym::RmsNormOptions o;
  o.eps = eps;
  o.mode = opgym::parse_mode(std::string_view(mode.data(), mode.size()));
  o.weight_offset = weight_offset;
  return o;
}

inline void check_add_rms_norm_in_place(const at::Tensor& x, at::ScalarType out_dtype) {
  TORCH_CHECK_VALUE(out_dtype == x.scalar_type(), "opgym::add_rms_norm_: in place needs an output dtype equal to x's ",
                    x.scalar_type(), ", but the weight promotes it to ", out_dtype, "; use opgym::add_rms_norm");
}

}  // namespace opgym_torch
