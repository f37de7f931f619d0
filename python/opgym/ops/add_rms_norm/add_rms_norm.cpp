// opgym::add_rms_norm's CPU kernels on torch's stable ABI (built into opgym/_stable.so; src/ops/add_rms_norm
// is the core). Schemas, fake kernels and autograd rules: meta.py beside this file. CUDA kernels:
// add_rms_norm_cuda.cpp (per-torch library, its checks in add_rms_norm.hpp).
//
//   opgym::add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, str mode="hf",
//                       bool weight_offset=False) -> (Tensor out, Tensor sum)
//   opgym::add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps, str norm_mode="hf",
//                        bool weight_offset=False) -> ()       # residual <- sum, x <- normed
//
// sum = residual + x in x's dtype (HF's order: rounded before the norm), out = rms_norm(sum, weight)
// with torch's promotion of (weight, x). residual must have x's shape and dtype (a named ValueError
// otherwise). The in-place form returns nothing, so torch.compile functionalizes it through
// auto_functionalized; x and residual must not overlap.
#include <string>
#include <tuple>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

// Returns the normalized output's dtype.
ScalarType check_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                              const std::string& mode, const char* op) {
  const opgym::DType xd = check_tensor_arg(x, "x", op);
  check_tensor_arg(residual, "residual", op);
  const opgym::DType wd = check_tensor_arg(weight, "weight", op);
  OPGYM_CHECK_VALUE(x.dim() >= 1 && x.dim() <= opgym::kMaxRank, "opgym::", op, ": x must have 1 to ", opgym::kMaxRank,
                    " dims, got ", x.dim());
  OPGYM_CHECK_VALUE(residual.scalar_type() == x.scalar_type(), "opgym::", op, ": residual must have dtype ",
                    dtype_name(x.scalar_type()), " (x's: HF adds the residual in the activations' dtype), got ",
                    dtype_name(residual.scalar_type()));
  check_same_shape(residual, "residual", x, "x", op);
  OPGYM_CHECK_VALUE(weight.dim() == 1, "opgym::", op, ": weight must be 1-D of size ", x.size(-1),
                    " (the last dim of x), got shape ", sizes_of(weight));
  OPGYM_CHECK_VALUE(weight.size(0) == x.size(-1), "opgym::", op, ": weight must have shape [", x.size(-1),
                    "] (the last dim of x), got ", sizes_of(weight));
  OPGYM_CHECK_VALUE(mode == "hf" || mode == "fp32", "opgym::", op, ": mode must be 'hf' or 'fp32', got '", mode, "'");
  OPGYM_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "opgym::", op, ": eps must be a finite number >= 0, got ", eps);
  check_device(residual, "residual", x, "x", op);
  check_device(weight, "weight", x, "x", op);
  return to_torch_dtype(opgym::rms_norm_out_dtype(xd, wd));
}

opgym::RmsNormOptions options(double eps, const std::string& mode, bool weight_offset) {
  opgym::RmsNormOptions o;
  o.eps = eps;
  o.mode = opgym::parse_mode(mode);
  o.weight_offset = weight_offset;
  return o;
}

std::tuple<Tensor, Tensor> add_rms_norm_cpu(Tensor x, Tensor residual, Tensor weight, double eps, std::string mode,
                                            bool weight_offset) {
  const ScalarType out_dtype = check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm");
  Tensor out = empty_output(x.sizes(), out_dtype);
  Tensor sum = empty_output(x.sizes(), x.scalar_type());
  translate_errors("add_rms_norm", [&] {
    opgym::add_rms_norm(view_of(x), view_of(residual), view_of(weight), view_of(out), view_of(sum),
                        options(eps, mode, weight_offset), &executor());
  });
  return {out, sum};
}

void add_rms_norm_inplace_cpu(Tensor x, Tensor residual, Tensor weight, double eps, std::string mode,
                              bool weight_offset) {
  const ScalarType out_dtype = check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm_");
  OPGYM_CHECK_VALUE(out_dtype == x.scalar_type(), "opgym::add_rms_norm_: in place needs an output dtype equal to x's ",
                    dtype_name(x.scalar_type()), ", but the weight promotes it to ", dtype_name(out_dtype),
                    "; use opgym::add_rms_norm");
  translate_errors("add_rms_norm_", [&] {
    opgym::add_rms_norm(view_of(x), view_of(residual), view_of(weight), view_of(x), view_of(residual),
                        options(eps, mode, weight_offset), &executor());
  });
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("add_rms_norm", TORCH_BOX(&add_rms_norm_cpu));
  m.impl("add_rms_norm_", TORCH_BOX(&add_rms_norm_inplace_cpu));
}
