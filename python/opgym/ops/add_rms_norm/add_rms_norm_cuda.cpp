// opgym::add_rms_norm's CUDA kernels on torch's stable ABI (built into opgym/_stable_cuda.so; schemas,
// fake kernels and autograd rules: meta.py; the checks the CPU kernels run too: add_rms_norm_stable.hpp):
// opgym::cuda::add_rms_norm on torch's current stream of x's device; outputs from torch's caching
// allocator (CUDA graphs work). Unverified on a GPU.
#include <string>
#include <tuple>

#include "csrc/stable.hpp"
#include "csrc/stable_cuda.hpp"
#include "opgym/opgym.hpp"
#include "ops/add_rms_norm/add_rms_norm_stable.hpp"
#include "ops/rms_norm/rms_norm_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

void run(const char* op, const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& out,
         const Tensor& sum, double eps, const std::string& mode, bool weight_offset) {
  const auto guard = device_guard(x);
  translate_errors(op, [&] {
    opgym::cuda::add_rms_norm(view_of(x), view_of(residual), view_of(weight), view_of(out), view_of(sum),
                              rms_norm_options(eps, mode, weight_offset), current_stream(x));
  });
}

std::tuple<Tensor, Tensor> add_rms_norm_cuda(Tensor x, Tensor residual, Tensor weight, double eps, std::string mode,
                                             bool weight_offset) {
  const ScalarType out_dtype = check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm");
  Tensor out = empty_on_device(x.sizes(), out_dtype, x);
  Tensor sum = empty_on_device(x.sizes(), x.scalar_type(), x);
  run("add_rms_norm", x, residual, weight, out, sum, eps, mode, weight_offset);
  return {out, sum};
}

void add_rms_norm_inplace_cuda(Tensor x, Tensor residual, Tensor weight, double eps, std::string mode,
                               bool weight_offset) {
  check_add_rms_norm_in_place(x, check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm_"));
  run("add_rms_norm_", x, residual, weight, x, residual, eps, mode, weight_offset);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("add_rms_norm", TORCH_BOX(&add_rms_norm_cuda));
  m.impl("add_rms_norm_", TORCH_BOX(&add_rms_norm_inplace_cuda));
}
