// RMSNorm's argument checks and options on torch's stable ABI, shared by opgym::rms_norm's CPU kernels
// (rms_norm.cpp) and CUDA kernels (rms_norm_cuda.cpp), and by opgym::add_rms_norm (whose norm is this one:
// it runs these checks under its own name, as its meta.py runs rms_norm's meta.check). The Python fake
// kernels (meta.py) give the same messages.
#pragma once

#include <cmath>
#include <string>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"

namespace opgym_stable {

// x's layout, dtype and rank, the weight's dtype, shape and device, mode, eps. Returns the output dtype
// (torch's promotion of weight and x). `op` names the operator in the messages.
inline ScalarType check_rms_norm(const Tensor& x, const Tensor& weight, double eps, const std::string& mode,
                                 const char* op = "rms_norm") {
  const opgym::DType xd = check_tensor_arg(x, "x", op);
  const opgym::DType wd = check_tensor_arg(weight, "weight", op);
  OPGYM_CHECK_VALUE(x.dim() >= 1 && x.dim() <= opgym::kMaxRank, "opgym::", op, ": x must have 1 to ", opgym::kMaxRank,
                    " dims, got ", x.dim());
  OPGYM_CHECK_VALUE(weight.dim() == 1, "opgym::", op, ": weight must be 1-D of size ", x.size(-1),
                    " (the last dim of x), got shape ", sizes_of(weight));
  OPGYM_CHECK_VALUE(weight.size(0) == x.size(-1), "opgym::", op, ": weight must have shape [", x.size(-1),
                    "] (the last dim of x), got ", sizes_of(weight));
  OPGYM_CHECK_VALUE(mode == "hf" || mode == "fp32", "opgym::", op, ": mode must be 'hf' or 'fp32', got '", mode, "'");
  OPGYM_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "opgym::", op, ": eps must be a finite number >= 0, got ", eps);
  check_device(weight, "weight", x, "x", op);
  return to_torch_dtype(opgym::rms_norm_out_dtype(xd, wd));
}

// The out form's checks beyond check_rms_norm: out's device, the promoted dtype, x's shape.
inline void check_rms_norm_out(const Tensor& x, const Tensor& weight, const Tensor& out, ScalarType out_dtype) {
  check_device(out, "out", x, "x", "rms_norm");
  OPGYM_CHECK_VALUE(out.scalar_type() == out_dtype, "opgym::rms_norm_out: out must have dtype ", dtype_name(out_dtype),
                    " (torch's promotion of weight ", dtype_name(weight.scalar_type()), " and x ",
                    dtype_name(x.scalar_type()), "), got ", dtype_name(out.scalar_type()));
  check_same_shape(out, "out", x, "x", "rms_norm_out");
}

// The in-place form's: the output dtype must be x's own.
inline void check_rms_norm_in_place(const Tensor& x, const Tensor& weight, ScalarType out_dtype) {
  OPGYM_CHECK_VALUE(out_dtype == x.scalar_type(), "opgym::rms_norm_: in place needs an output dtype equal to x's ",
                    dtype_name(x.scalar_type()), ", but weight ", dtype_name(weight.scalar_type()), " promotes it to ",
                    dtype_name(out_dtype), "; use opgym::rms_norm or rms_norm_out");
}

inline opgym::RmsNormOptions rms_norm_options(double eps, const std::string& mode, bool weight_offset) {
  opgym::RmsNormOptions o;
  o.eps = eps;
  o.mode = opgym::parse_mode(mode);
  o.weight_offset = weight_offset;
  return o;
}

}  // namespace opgym_stable
