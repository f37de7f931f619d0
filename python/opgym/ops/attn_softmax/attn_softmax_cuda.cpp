// opgym::attn_softmax's CUDA kernels (schemas: attn_softmax.cpp; checks: attn_softmax.hpp): opgym::cuda::attn_softmax
// on torch's current stream of the scores' device; the functional output from torch's caching allocator (CUDA
// graphs work). The kernel follows torch's CUDA softmax semantics within 1 ulp, not bit for bit (its sum order is a
// warp's, torch's its block's; src/ops/attn_softmax/README.md), so opgym.patch does not serve CUDA models with it
// (integration.py). No segmented form on CUDA: attn_softmax_segments has no CUDA kernel. Unverified on a GPU.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "csrc/torch_common.hpp"
#include "opgym/attn_softmax.hpp"
#include "ops/attn_softmax/attn_softmax.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

void run(const char* op, const at::Tensor& scores, const at::Tensor& out, double scale,
         const c10::optional<at::Tensor>& mask) {
  const c10::cuda::CUDAGuard guard(scores.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(scores.device().index()).stream();
  opgym::AttnSoftmaxOptions o;
  o.scale = static_cast<float>(scale);  // what torch's mul does with a Python float
  at::Tensor m;
  opgym::TensorView mv;
  if (mask.has_value()) {
    m = attn_softmax_core_mask(scores, *mask);
    mv = view_of(m);
    o.mask = &mv;
  }
  translate_errors(op, [&] { opgym::cuda::attn_softmax(view_of(scores), view_of(out), o, stream); });
}

at::Tensor attn_softmax_cuda(const at::Tensor& scores, double scale, const c10::optional<at::Tensor>& mask) {
  check_attn_softmax(scores, mask, "attn_softmax");
  const c10::cuda::CUDAGuard guard(scores.device());
  // Any strided scores are read; a last dim that is not contiguous is copied first (as on the CPU).
  const at::Tensor s =
      scores.dim() == 0 || scores.size(-1) <= 1 || scores.stride(-1) == 1 ? scores : scores.contiguous();
  at::Tensor out = at::empty(scores.sizes(), scores.options());
  run("attn_softmax", s, out, scale, mask);
  return out;
}

void attn_softmax_inplace_cuda(const at::Tensor& scores, double scale, const c10::optional<at::Tensor>& mask) {
  check_attn_softmax(scores, mask, "attn_softmax_");
  run("attn_softmax_", scores, scores, scale, mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("attn_softmax", &attn_softmax_cuda);
  m.impl("attn_softmax_", &attn_softmax_inplace_cuda);
}
