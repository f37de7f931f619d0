// opgym::add_rms_norm's argument checks on torch's stable ABI, shared by its CPU kernels (add_rms_norm.cpp)
// and CUDA kernels (add_rms_norm_cuda.cpp): the residual's checks, then RMSNorm's own under this op's name
// (meta.py's check runs the same, in this order). Its options are RMSNorm's (rms_norm_options).
#pragma once

#include <string>

#include "csrc/stable.hpp"
#include "ops/rms_norm/rms_norm_stable.hpp"

namespace opgym_stable {

// Returns the normalized output's dtype.
inline ScalarType check_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                                     const std::string& mode, const char* op) {
  check_tensor_arg(x, "x", op);
  check_tensor_arg(residual, "residual", op);
  OPGYM_CHECK_VALUE(residual.scalar_type() == x.scalar_type(), "opgym::", op, ": residual must have dtype ",
                    dtype_name(x.scalar_type()), " (x's: HF adds the residual in the activations' dtype), got ",
                    dtype_name(residual.scalar_type()));
  check_same_shape(residual, "residual", x, "x", op);
  check_device(residual, "residual", x, "x", op);
  return check_rms_norm(x, weight, eps, mode, op);
}

// The in-place form's: the output dtype must be x's own.
inline void check_add_rms_norm_in_place(const Tensor& x, ScalarType out_dtype) {
  OPGYM_CHECK_VALUE(out_dtype == x.scalar_type(), "opgym::add_rms_norm_: in place needs an output dtype equal to x's ",
                    dtype_name(x.scalar_type()), ", but the weight promotes it to ", dtype_name(out_dtype),
                    "; use opgym::add_rms_norm");
}

}  // namespace opgym_stable
