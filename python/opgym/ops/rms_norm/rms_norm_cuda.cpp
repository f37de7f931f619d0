// opgym::rms_norm's CUDA kernels on torch's stable ABI (built into opgym/_stable_cuda.so; schemas, fake
// kernels and autograd rules: meta.py; the checks the CPU kernels run too: rms_norm_stable.hpp). Each call
// runs opgym::cuda::rms_norm on torch's current stream of x's device: no host synchronization, no
// allocation but the functional form's output (from torch's caching allocator, so CUDA graph capture and
// torch.compile(mode="reduce-overhead") work), no host-device copies. Errors from the core (opgym::Error)
// become ValueError, a failed launch a RuntimeError naming the CUDA error. Unverified on a GPU.
#include <string>

#include "csrc/stable.hpp"
#include "csrc/stable_cuda.hpp"
#include "opgym/opgym.hpp"
#include "ops/rms_norm/rms_norm_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

void run_cuda(const Tensor& x, const Tensor& weight, const Tensor& out, double eps, const std::string& mode,
              bool weight_offset) {
  const auto guard = device_guard(x);
  translate_errors("rms_norm", [&] {
    opgym::cuda::rms_norm(view_of(x), view_of(weight), view_of(out), rms_norm_options(eps, mode, weight_offset),
                          current_stream(x));
  });
}

Tensor rms_norm_cuda(Tensor x, Tensor weight, double eps, std::string mode, bool weight_offset) {
  const ScalarType out_dtype = check_rms_norm(x, weight, eps, mode);
  Tensor out = empty_on_device(x.sizes(), out_dtype, x);
  run_cuda(x, weight, out, eps, mode, weight_offset);
  return out;
}

Tensor rms_norm_out_cuda(Tensor x, Tensor weight, double eps, std::string mode, bool weight_offset, Tensor out) {
  check_rms_norm_out(x, weight, out, check_rms_norm(x, weight, eps, mode));
  run_cuda(x, weight, out, eps, mode, weight_offset);
  return out;
}

Tensor rms_norm_inplace_cuda(Tensor x, Tensor weight, double eps, std::string mode, bool weight_offset) {
  check_rms_norm_in_place(x, weight, check_rms_norm(x, weight, eps, mode));
  run_cuda(x, weight, x, eps, mode, weight_offset);
  return x;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("rms_norm", TORCH_BOX(&rms_norm_cuda));
  m.impl("rms_norm_out", TORCH_BOX(&rms_norm_out_cuda));
  m.impl("rms_norm_", TORCH_BOX(&rms_norm_inplace_cuda));
}
