// opgym::rotary's CUDA kernels (schemas: rotary.cpp; checks: rotary.hpp): opgym::cuda::rotary on
// torch's current stream of q's device; outputs from torch's caching allocator (CUDA graphs work).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "csrc/torch_common.hpp"
#include "opgym/rotary.hpp"
#include "ops/rotary/rotary.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

void run(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
         const at::Tensor& qo, const at::Tensor& ko, int64_t unsqueeze_dim, c10::string_view mode,
         const c10::optional<at::IntArrayRef>& mrope_section, c10::string_view pairs, bool pair_table) {
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  translate_errors(op, [&] {
    opgym::cuda::rotary(view_of(q), view_of(k), view_of(cos), view_of(sin), view_of(qo), view_of(ko),
                        rotary_options(unsqueeze_dim, mode, mrope_section, pairs, pair_table), stream);
  });
}

std::tuple<at::Tensor, at::Tensor> rotary_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                               const at::Tensor& sin, int64_t unsqueeze_dim, c10::string_view mode,
                                               c10::optional<at::IntArrayRef> mrope_section, c10::string_view pairs,
                                               bool pair_table, bool contiguous) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary");
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor qo = rotary_output(q, contiguous), ko = rotary_output(k, contiguous);
  run("rotary", q, k, cos, sin, qo, ko, unsqueeze_dim, mode, mrope_section, pairs, pair_table);
  return {qo, ko};
}

void rotary_inplace_cuda(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                         int64_t unsqueeze_dim, c10::string_view mode, c10::optional<at::IntArrayRef> mrope_section,
                         c10::string_view pairs, bool pair_table) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary_");
  run("rotary_", q, k, cos, sin, q, k, unsqueeze_dim, mode, mrope_section, pairs, pair_table);
}

}  // namespace

TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("rotary", &rotary_cuda);
  m.impl("rotary_", &rotary_inplace_cuda);
}
