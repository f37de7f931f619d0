// add_rms_norm on NVIDIA GPUs: the residual add (rounded to x's dtype, as HF adds) into sum_out,
// then RMSNorm's own CUDA kernels over the sum (opgym::cuda::rms_norm), both on the caller's stream.
// Two launches: the single-pass kernel belongs to the CUDA rebuild of RMSNorm (docs/CUDA.md); this
// keeps the contract and the CPU front's argument errors (detail::check_add_rms_norm_args) meanwhile.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/checks.hpp"
#include "opgym/add_rms_norm.hpp"
#include "core/cuda_dtypes.cuh"
#include "ops/add_rms_norm/kernel.hpp"

namespace opgym::cuda {

namespace {


struct AddParams {
  const void* x;
  const void* r;
  void* s;
  int64_t rows, dim;
  bool collapse;
  int64_t x_rs, r_rs, s_rs;
  int lead_rank;
  int64_t lead_shape[kMaxRank], x_lead[kMaxRank], r_lead[kMaxRank], s_lead[kMaxRank];
};

// Blocks loop over rows, threads over a row's elements; every offset is 64-bit. Reading x and r
// before writing s keeps in place (s being x or r) exact.
template <class T>
__global__ void add_rows_kernel(AddParams p) {
  using S = typename T::S;
  const S* x = static_cast<const S*>(p.x);
  const S* r = static_cast<const S*>(p.r);
  S* s = static_cast<S*>(p.s);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    int64_t xo = 0, ro = 0, so = 0;
    if (p.collapse) {
      xo = row * p.x_rs, ro = row * p.r_rs, so = row * p.s_rs;
    } else {
      int64_t q = row;
      for (int d = p.lead_rank - 1; d >= 0; --d) {
        const int64_t i = q % p.lead_shape[d];
        q /= p.lead_shape[d];
        xo += i * p.x_lead[d], ro += i * p.r_lead[d], so += i * p.s_lead[d];
      }
    }
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x)
      s[so + i] = T::from_f32(__fadd_rn(T::to_f32(r[ro + i]), T::to_f32(x[xo + i])));
  }
}

}  // namespace

void add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView& weight, const TensorView& out,
                  const TensorView& sum_out, const RmsNormOptions& opt, CUstream_st* stream) {
  static constexpr const char* op = "add_rms_norm";
  if (opt.sum_order == SumOrder::torch_cpu)
    throw Error("sum_order", std::string(op) + ": sum_order torch_cpu is the CPU's order; CUDA sums in the lanes64 order "
                             "(pass automatic or lanes64)");
  if (!detail::check_add_rms_norm_args(x, residual, weight, out, sum_out, opt)) return;
  const detail::AddRowsJob job = detail::add_rows_job(x, residual, sum_out);
  AddParams p{};
  p.x = job.x, p.r = job.r, p.s = job.s;
  p.rows = x.rows(), p.dim = job.dim;
  p.collapse = job.collapse;
  p.x_rs = job.x_row_stride, p.r_rs = job.r_row_stride, p.s_rs = job.s_row_stride;
  p.lead_rank = job.lead_rank;
  for (int d = 0; d < job.lead_rank; ++d) {
    p.lead_shape[d] = job.lead_shape[d];
    p.x_lead[d] = job.x_lead[d], p.r_lead[d] = job.r_lead[d], p.s_lead[d] = job.s_lead[d];
  }
  const unsigned blocks = static_cast<unsigned>(p.rows < 65536 ? p.rows : 65536);
  const unsigned threads = p.dim >= 512 ? 256u : p.dim >= 128 ? 128u : 32u;
  cudaStream_t st = stream;
  switch (x.dtype) {
    case DType::float16: add_rows_kernel<DF16><<<blocks, threads, 0, st>>>(p); break;
    case DType::bfloat16: add_rows_kernel<DBF16><<<blocks, threads, 0, st>>>(p); break;
    default: add_rows_kernel<DF32><<<blocks, threads, 0, st>>>(p); break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("opgym::cuda::add_rms_norm: kernel launch failed: ") + cudaGetErrorString(e));
  rms_norm(sum_out, weight, out, opt, stream);
}

}  // namespace opgym::cuda
