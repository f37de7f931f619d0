// opgym::add_rms_norm's CUDA kernels (schemas: add_rms_norm.cpp; checks: add_rms_norm.hpp):
// opgym::cuda::add_rms_norm on torch's current stream of x's device; outputs from torch's caching
// allocator (CUDA graphs work).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "csrc/torch_common.hpp"
#include "opgym/add_rms_norm.hpp"
#include "ops/add_rms_norm/add_rms_norm.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

void run(const char* op, const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& out,
         const at::Tensor& sum, double eps, c10::string_view mode, bool weight_offset) {
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  translate_errors(op, [&] {
    opgym::cuda::add_rms_norm(view_of(x), view_of(residual), view_of(weight), view_of(out), view_of(sum),
                              add_rms_norm_options(eps, mode, weight_offset), stream);
  });
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps, c10::string_view mode,
                                                     bool weight_offset) {
  const at::ScalarType out_dtype = check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype).memory_format(at::MemoryFormat::Contiguous));
  at::Tensor sum = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  run("add_rms_norm", x, residual, weight, out, sum, eps, mode, weight_offset);
  return {out, sum};
}

void add_rms_norm_inplace_cuda(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps,
                               c10::string_view mode, bool weight_offset) {
  check_add_rms_norm_in_place(x, check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm_"));
  run("add_rms_norm_", x, residual, weight, x, residual, eps, mode, weight_offset);
}

}  // namespace

TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("add_rms_norm", &add_rms_norm_cuda);
  m.impl("add_rms_norm_", &add_rms_norm_inplace_cuda);
}
