// opgym::attn_softmax's CUDA kernels on torch's stable ABI (built into opgym/_stable_cuda.so; schemas, fake
// kernels and autograd rules: meta.py; the checks and core inputs the CPU kernels use too:
// attn_softmax_stable.hpp): opgym::cuda::attn_softmax on torch's current stream of the scores' device; the
// functional output from torch's caching allocator (CUDA graphs work). The kernel follows torch's CUDA
// softmax semantics within 1 ulp, not bit for bit (its sum order is a warp's, torch's its block's;
// src/ops/attn_softmax/README.md), so opgym.patch does not serve CUDA models with it (integration.py). No
// segmented form on CUDA: attn_softmax_segments, attn_eager and attn_windows have no CUDA kernel.
// Unverified on a GPU.
#include <optional>

#include "csrc/stable.hpp"
#include "csrc/stable_cuda.hpp"
#include "opgym/opgym.hpp"
#include "ops/attn_softmax/attn_softmax_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

void run(const char* op, const Tensor& scores, const Tensor& out, double scale, const std::optional<Tensor>& mask) {
  const auto guard = device_guard(scores);
  opgym::AttnSoftmaxOptions o;
  o.scale = static_cast<float>(scale);  // what torch's mul does with a Python float
  Tensor m;
  opgym::TensorView mv;
  if (mask.has_value()) {
    m = attn_softmax_core_mask(scores, *mask);
    mv = view_of(m);
    o.mask = &mv;
  }
  translate_errors(op, [&] { opgym::cuda::attn_softmax(view_of(scores), view_of(out), o, current_stream(scores)); });
}

Tensor attn_softmax_cuda(Tensor scores, double scale, std::optional<Tensor> mask) {
  check_attn_softmax(scores, mask, "attn_softmax");
  Tensor out = empty_on_device(scores.sizes(), scores.scalar_type(), scores);  // contiguous, as on the CPU
  run("attn_softmax", attn_softmax_readable(scores), out, scale, mask);
  return out;
}

void attn_softmax_inplace_cuda(Tensor scores, double scale, std::optional<Tensor> mask) {
  check_attn_softmax(scores, mask, "attn_softmax_");
  run("attn_softmax_", scores, scores, scale, mask);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("attn_softmax", TORCH_BOX(&attn_softmax_cuda));
  m.impl("attn_softmax_", TORCH_BOX(&attn_softmax_inplace_cuda));
}
