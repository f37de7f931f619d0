// opgym::swiglu's CUDA kernels (schemas: swiglu.cpp; checks: swiglu.hpp): opgym::cuda::swiglu on
// torch's current stream of gate's device; outputs from torch's caching allocator (CUDA graphs work).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "csrc/torch_common.hpp"
#include "opgym/swiglu.hpp"
#include "ops/swiglu/swiglu.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

at::Tensor swiglu_cuda(const at::Tensor& gate, const at::Tensor& up, c10::string_view activation) {
  check_swiglu(gate, up, "swiglu");
  const opgym::GluActivation act = glu_activation(activation, "swiglu");
  const c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor out = at::empty(gate.sizes(), gate.options());  // contiguous, as the CPU kernel
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(gate.device().index()).stream();
  translate_errors("swiglu", [&] { opgym::cuda::swiglu(view_of(gate), view_of(up), view_of(out), stream, act); });
  return out;
}

at::Tensor swiglu_merged_cuda(const at::Tensor& gate_up, c10::string_view activation) {
  check_swiglu_merged(gate_up, "swiglu_merged");
  const opgym::GluActivation act = glu_activation(activation, "swiglu_merged");
  const c10::cuda::CUDAGuard guard(gate_up.device());
  at::Tensor out = swiglu_merged_out(gate_up);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(gate_up.device().index()).stream();
  translate_errors("swiglu_merged", [&] { opgym::cuda::swiglu_merged(view_of(gate_up), view_of(out), stream, act); });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("swiglu", &swiglu_cuda);
  m.impl("swiglu_merged", &swiglu_merged_cuda);
}
