// What opgym's CPU and CUDA torch kernels share: dtype mapping, the checks that need no data (the
// Meta kernels use them too, so fake tensors raise what real ones do), and TensorView from a Tensor.
#pragma once
#include <ATen/ATen.h>

#include <cmath>

#include "opgym/opgym.hpp"

namespace opgym_torch {

inline opgym::DType to_opgym_dtype(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat: return opgym::DType::float32;
    case at::kHalf: return opgym::DType::float16;
    case at::kBFloat16: return opgym::DType::bfloat16;
    default:
      TORCH_CHECK_VALUE(false, "opgym::rms_norm: ", name, " has dtype ", t,
                        "; expected torch.float32, torch.float16 or torch.bfloat16");
  }
  return opgym::DType::float32;  // not reached
}

inline at::ScalarType to_aten_dtype(opgym::DType t) {
  switch (t) {
    case opgym::DType::float16: return at::kHalf;
    case opgym::DType::bfloat16: return at::kBFloat16;
    default: return at::kFloat;
  }
}

// Checks that need no data: layout, dtype, rank, weight's shape. Shared by the CPU and Meta kernels
// so fake tensors raise what real ones do. Returns the output dtype.
inline at::ScalarType check_common(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode) {
  TORCH_CHECK_VALUE(x.defined(), "opgym::rms_norm: x is undefined");
  TORCH_CHECK_VALUE(weight.defined(), "opgym::rms_norm: weight is undefined");
  TORCH_CHECK_VALUE(x.layout() == at::kStrided, "opgym::rms_norm: x must be a strided (dense) tensor, got layout ", x.layout());
  TORCH_CHECK_VALUE(weight.layout() == at::kStrided, "opgym::rms_norm: weight must be a strided (dense) tensor, got layout ",
                    weight.layout());
  const opgym::DType xd = to_opgym_dtype(x.scalar_type(), "x");
  const opgym::DType wd = to_opgym_dtype(weight.scalar_type(), "weight");
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

inline void check_device(const at::Tensor& t, const char* name, const at::Device& want) {
  TORCH_CHECK(t.device() == want, "opgym::rms_norm: ", name, " is on ", t.device(), " but x is on ", want,
              "; every tensor must be on one device");
}

inline opgym::TensorView view_of(const at::Tensor& t) {
  const int64_t rank = t.dim();
  return opgym::TensorView::strided(t.data_ptr(), to_opgym_dtype(t.scalar_type(), "tensor"), t.sizes().data(),
                                    t.strides().data(), static_cast<int>(rank));
}

// The out form's checks beyond check_common (real and Meta kernels): device, the promoted dtype, x's shape.
inline void check_out(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& out, at::ScalarType out_dtype) {
  check_device(weight, "weight", x.device());
  check_device(out, "out", x.device());
  TORCH_CHECK_VALUE(out.scalar_type() == out_dtype, "opgym::rms_norm_out: out must have dtype ", out_dtype,
                    " (torch's promotion of weight ", weight.scalar_type(), " and x ", x.scalar_type(), "), got ",
                    out.scalar_type());
  TORCH_CHECK_VALUE(out.dim() == x.dim(), "opgym::rms_norm_out: out must have the shape of x ", x.sym_sizes(), ", got ",
                    out.sym_sizes());
  for (int64_t d = 0; d < x.dim(); ++d) {
    // Concrete sizes give a ValueError like every other bad value; symbolic ones (Meta kernels under
    // torch.compile) a symbolic check, so no guard is added on the size.
    const c10::SymBool eq = out.sym_size(d).sym_eq(x.sym_size(d));
    if (const auto known = eq.maybe_as_bool()) {
      TORCH_CHECK_VALUE(*known, "opgym::rms_norm_out: out must have the shape of x ", x.sym_sizes(), ", got ",
                        out.sym_sizes());
    } else {
      TORCH_SYM_CHECK(eq, "opgym::rms_norm_out: out must have the shape of x ", x.sym_sizes(), ", got ", out.sym_sizes());
    }
  }
}

// The in-place form's (real and Meta kernels): the output dtype must be x's own.
inline void check_in_place(const at::Tensor& x, const at::Tensor& weight, at::ScalarType out_dtype) {
  check_device(weight, "weight", x.device());
  TORCH_CHECK_VALUE(out_dtype == x.scalar_type(), "opgym::rms_norm_: in place needs an output dtype equal to x's ",
                    x.scalar_type(), ", but weight ", weight.scalar_type(), " promotes it to ", out_dtype,
                    "; use opgym::rms_norm or rms_norm_out");
}

}  // namespace opgym_torch
