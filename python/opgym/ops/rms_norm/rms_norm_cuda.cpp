// opgym::rms_norm's CUDA kernels (schemas and CPU/Meta kernels: rms_norm.cpp; the checks both share:
// rms_norm.hpp). Each call runs opgym::cuda::rms_norm on torch's current stream of x's device: no host
// synchronization, no allocation but the functional form's output (from torch's caching allocator, so
// CUDA graph capture and torch.compile(mode="reduce-overhead") work), no host-device copies. Argument
// checks and their messages are the CPU kernels'; errors from the core (opgym::Error) become ValueError.
//
// Built into opgym/_C.so only when the core has CUDA and torch was built with it (python/CMakeLists.txt).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <exception>

#include "csrc/torch_common.hpp"
#include "opgym/rms_norm.hpp"
#include "ops/rms_norm/rms_norm.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

// Enqueues the kernel on the current stream of x's device. opgym::Error becomes a ValueError; a
// failed launch a RuntimeError naming the CUDA error.
void run_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& out, double eps, c10::string_view mode,
              bool weight_offset) {
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  try {
    opgym::cuda::rms_norm(view_of(x), view_of(weight), view_of(out), rms_norm_options(eps, mode, weight_offset),
                          stream);
  } catch (const opgym::Error& e) {
    TORCH_CHECK_VALUE(false, "opgym::", e.what(), " [argument: ", e.argument(), "]");
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "opgym::rms_norm (cuda): ", e.what());
  }
}

// ---- CUDA ---------------------------------------------------------------------------------------

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                         bool weight_offset) {
  const at::ScalarType out_dtype = check_rms_norm(x, weight, eps, mode);
  check_rms_norm_weight_device(x, weight);
  const c10::cuda::CUDAGuard guard(x.device());  // allocate on x's device
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype).memory_format(at::MemoryFormat::Contiguous));
  run_cuda(x, weight, out, eps, mode, weight_offset);
  return out;
}

at::Tensor& rms_norm_out_cuda(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                              bool weight_offset, at::Tensor& out) {
  check_rms_norm_out(x, weight, out, check_rms_norm(x, weight, eps, mode));
  run_cuda(x, weight, out, eps, mode, weight_offset);
  return out;
}

at::Tensor& rms_norm_inplace_cuda(at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                                  bool weight_offset) {
  check_rms_norm_in_place(x, weight, check_rms_norm(x, weight, eps, mode));
  run_cuda(x, weight, x, eps, mode, weight_offset);
  return x;
}

}  // namespace

TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("rms_norm_out", &rms_norm_out_cuda);
  m.impl("rms_norm_", &rms_norm_inplace_cuda);
}
