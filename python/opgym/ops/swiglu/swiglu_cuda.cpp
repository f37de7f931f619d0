// opgym::swiglu's CUDA kernels on torch's stable ABI (built into opgym/_stable_cuda.so; schemas, fake
// kernels and autograd rules: meta.py; the checks the CPU kernels run too: swiglu_stable.hpp):
// opgym::cuda::swiglu on torch's current stream of gate's device; outputs contiguous (as the CPU
// kernels'), from torch's caching allocator (CUDA graphs work). Unverified on a GPU.
#include <string>

#include "csrc/stable.hpp"
#include "csrc/stable_cuda.hpp"
#include "opgym/opgym.hpp"
#include "ops/swiglu/swiglu_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

Tensor swiglu_cuda(Tensor gate, Tensor up, std::string activation) {
  check_swiglu(gate, up, "swiglu");
  const opgym::GluActivation act = glu_activation(activation, "swiglu");
  Tensor out = empty_on_device(gate.sizes(), gate.scalar_type(), gate);
  const auto guard = device_guard(gate);
  translate_errors("swiglu",
                   [&] { opgym::cuda::swiglu(view_of(gate), view_of(up), view_of(out), current_stream(gate), act); });
  return out;
}

Tensor swiglu_merged_cuda(Tensor gate_up, std::string activation) {
  check_swiglu_merged(gate_up, "swiglu_merged");
  const opgym::GluActivation act = glu_activation(activation, "swiglu_merged");
  Tensor out = empty_on_device(swiglu_merged_shape(gate_up), gate_up.scalar_type(), gate_up);
  const auto guard = device_guard(gate_up);
  translate_errors("swiglu_merged", [&] {
    opgym::cuda::swiglu_merged(view_of(gate_up), view_of(out), current_stream(gate_up), act);
  });
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("swiglu", TORCH_BOX(&swiglu_cuda));
  m.impl("swiglu_merged", TORCH_BOX(&swiglu_merged_cuda));
}
