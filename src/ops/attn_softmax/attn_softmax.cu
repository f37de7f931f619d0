// attn_softmax on NVIDIA GPUs: opgym::attn_softmax's arguments and errors (detail::make_attn_softmax_job builds
// the same job), with torch's CUDA semantics for HF's sequence: round(s * scale) and round(+ mask) as torch's
// elementwise kernels (fp32 math, one rounding each), then softmax(dtype=float32) as torch's CUDA softmax:
// max, e = expf(x - max) (the accurate expf: no fast math), the fp32 sum, e / sum (IEEE divide), rounded to
// the dtype. torch sums in its block's order, this kernel in its warp's: within 1 ulp of torch's result, not
// bit for bit. Unverified on a GPU so far.
//
// One warp per row, 8 rows per 256-thread block, rows grid-strided. Rows up to 32 * kPerLane elements are held
// in registers (one read of scores and mask, one write); longer rows are read three times (max, sum, write),
// each element by the same lane in every pass, so out may be scores itself.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/cuda_dtypes.cuh"
#include "opgym/error.hpp"
#include "ops/attn_softmax/kernel.hpp"

namespace opgym::cuda {

namespace {

constexpr int kPerLane = 32;  // registers per lane for a cached row: rows of up to 1024 elements
constexpr int kRowsPerBlock = 8;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

struct RowPtrs {
  const void* s;
  const void* m;
  void* o;
};

// Row r's pointers (the front keeps rows < 2^31, so the unravelling divides in 32 bits: no 64-bit division
// subroutine).
__device__ __forceinline__ RowPtrs row_ptrs(const detail::AttnSoftmaxJob& job, uint32_t r, size_t es) {
  int64_t so = 0, mo = 0, oo = 0;
  for (int d = job.lead_rank - 1; d >= 0; --d) {
    const uint32_t len = static_cast<uint32_t>(job.lead_shape[d]), i = r % len;
    r /= len;
    so += i * job.s_lead[d], mo += i * job.m_lead[d], oo += i * job.o_lead[d];
  }
  return {job.scores + so * es, job.mask ? job.mask + mo * es : nullptr, job.out + oo * es};
}

// HF's x for one element: round(round(s * scale) + mask), as fp32.
template <class T>
__device__ __forceinline__ float scaled(const typename T::S* s, const typename T::S* m, int64_t j, float scale) {
  float x = T::to_f32(T::from_f32(__fmul_rn(T::to_f32(s[j]), scale)));
  if (m) x = T::to_f32(T::from_f32(__fadd_rn(x, T::to_f32(m[j]))));
  return x;
}

// NaN-propagating max (fmaxf drops a NaN; torch's max propagates it, and then every output is NaN).
__device__ __forceinline__ float max_nan(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b); }

template <class T, bool kCached>
__global__ void __launch_bounds__(32 * kRowsPerBlock) attn_softmax_kernel(detail::AttnSoftmaxJob job) {
  using S = typename T::S;
  const int lane = threadIdx.x & 31;
  const uint32_t warps = gridDim.x * kRowsPerBlock, rows = static_cast<uint32_t>(job.rows);
  const int64_t n = job.dim;
  for (uint32_t r = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5); r < rows; r += warps) {
    const RowPtrs p = row_ptrs(job, r, sizeof(S));
    const S* s = static_cast<const S*>(p.s);
    const S* m = static_cast<const S*>(p.m);
    S* o = static_cast<S*>(p.o);
    float mx = -__int_as_float(0x7f800000);
    if constexpr (kCached) {
      float x[kPerLane];
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t j = lane + 32 * k;
        x[k] = j < n ? scaled<T>(s, m, j, job.scale) : -__int_as_float(0x7f800000);
        mx = max_nan(mx, x[k]);
      }
      mx = warp_max(mx);
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        x[k] = lane + 32 * k < n ? expf(__fsub_rn(x[k], mx)) : 0.0f;
        sum = __fadd_rn(sum, x[k]);
      }
      sum = warp_sum(sum);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t j = lane + 32 * k;
        if (j < n) o[j] = T::from_f32(__fdiv_rn(x[k], sum));
      }
    } else {
      for (int64_t j = lane; j < n; j += 32) mx = max_nan(mx, scaled<T>(s, m, j, job.scale));
      mx = warp_max(mx);
      float sum = 0.0f;
      for (int64_t j = lane; j < n; j += 32) sum = __fadd_rn(sum, expf(__fsub_rn(scaled<T>(s, m, j, job.scale), mx)));
      sum = warp_sum(sum);
      for (int64_t j = lane; j < n; j += 32)
        o[j] = T::from_f32(__fdiv_rn(expf(__fsub_rn(scaled<T>(s, m, j, job.scale), mx)), sum));
    }
  }
}

}  // namespace

void attn_softmax(const TensorView& scores, const TensorView& out, const AttnSoftmaxOptions& options,
                  CUstream_st* stream) {
  detail::AttnSoftmaxJob job;
  if (!detail::make_attn_softmax_job(scores, out, options, nullptr, 0, false, job)) return;
  if (job.rows >= (int64_t{1} << 31))
    throw Error("scores", "attn_softmax (CUDA): scores has " + std::to_string(job.rows) + " rows; at most 2^31 - 1");
  const int64_t want = (job.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 16 ? want : 65535 * 16);
  const bool cached = job.dim <= 32 * kPerLane;
  with_device_dtype(job.dtype, [&](auto t) {
    using T = decltype(t);
    if (cached) attn_softmax_kernel<T, true><<<blocks, 32 * kRowsPerBlock, 0, stream>>>(job);
    else attn_softmax_kernel<T, false><<<blocks, 32 * kRowsPerBlock, 0, stream>>>(job);
  });
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("opgym::cuda::attn_softmax: kernel launch failed: ") + cudaGetErrorString(e));
}

}  // namespace opgym::cuda
