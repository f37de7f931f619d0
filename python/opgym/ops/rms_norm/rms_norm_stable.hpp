// RMSNorm's argument checks and options on torch's stable ABI, shared by opgym::rms_norm (rms_norm.cpp)
// and opgym::add_rms_norm (whose norm is this one: it runs these checks under its own name, as its
// meta.py runs rms_norm's meta.check). The Python fake kernels (meta.py) give the same messages.
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

inline opgym::RmsNormOptions rms_norm_options(double eps, const std::string& mode, bool weight_offset) {
  opgym::RmsNormOptions o;
  o.eps = eps;
  o.mode = opgym::parse_mode(mode);
  o.weight_offset = weight_offset;
  return o;
}

}  // namespace opgym_stable
