// opgym::add_rms_norm's CPU kernels on torch's stable ABI (built into opgym/_stable.so; src/ops/add_rms_norm
// is the core). Schemas, fake kernels and autograd rules: meta.py beside this file. CUDA kernels:
// add_rms_norm_cuda.cpp (opgym/_stable_cuda.so); both run the checks of add_rms_norm_stable.hpp.
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
#include "ops/add_rms_norm/add_rms_norm_stable.hpp"
#include "ops/rms_norm/rms_norm_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

std::tuple<Tensor, Tensor> add_rms_norm_cpu(Tensor x, Tensor residual, Tensor weight, double eps, std::string mode,
                                            bool weight_offset) {
  const ScalarType out_dtype = check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm");
  Tensor out = empty_output(x.sizes(), out_dtype);
  Tensor sum = empty_output(x.sizes(), x.scalar_type());
  translate_errors("add_rms_norm", [&] {
    opgym::add_rms_norm(view_of(x), view_of(residual), view_of(weight), view_of(out), view_of(sum),
                        rms_norm_options(eps, mode, weight_offset), &executor());
  });
  return {out, sum};
}

void add_rms_norm_inplace_cpu(Tensor x, Tensor residual, Tensor weight, double eps, std::string mode,
                              bool weight_offset) {
  check_add_rms_norm_in_place(x, check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm_"));
  translate_errors("add_rms_norm_", [&] {
    opgym::add_rms_norm(view_of(x), view_of(residual), view_of(weight), view_of(x), view_of(residual),
                        rms_norm_options(eps, mode, weight_offset), &executor());
  });
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("add_rms_norm", TORCH_BOX(&add_rms_norm_cpu));
  m.impl("add_rms_norm_", TORCH_BOX(&add_rms_norm_inplace_cpu));
}
