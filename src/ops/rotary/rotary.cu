// rotary on NVIDIA GPUs: the contract of opgym::rotary (include/opgym/rotary.hpp) and the CPU front's
// argument errors (detail::make_rotary_job builds the same job). Half and interleaved pairs: one
// thread per (row, item), an item being a pair j (it reads both elements and their cos/sin, the MRoPE
// stream chosen per j, and writes both outputs, so in place is exact) or one pass-through element of
// dims [R, D) (copied unless in place). Deinterleave (adjacent pairs in, halves out): one block per row,
// which reads the row's rotated part into shared memory before any thread writes (in place is exact).
// Products and sums are separate roundings (__fmul_rn, __fadd_rn, -fmad=false); the hf mode rounds
// each to the dtype as the CPU does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/cuda_dtypes.cuh"
#include "opgym/error.hpp"
#include "opgym/rotary.hpp"
#include "ops/rotary/kernel.hpp"

namespace opgym::cuda {

namespace {


struct RowAt {  // a row's element offsets into x, out, cos and sin
  const detail::RotaryTensor* t;
  int64_t io, oo, co, so;
};

__device__ inline RowAt row_at(const detail::RotaryJob& job, int64_t r) {
  const int side = r < job.t[0].rows ? 0 : 1;
  const detail::RotaryTensor& t = job.t[side];
  if (side) r -= job.t[0].rows;
  RowAt a{&t, 0, 0, 0, 0};
  for (int d = t.lead_rank - 1; d >= 0; --d) {
    const int64_t i = r % t.lead_shape[d];
    r /= t.lead_shape[d];
    a.io += i * t.in_lead[d], a.oo += i * t.out_lead[d], a.co += i * t.cos_lead[d], a.so += i * t.sin_lead[d];
  }
  return a;
}

// out_a = a * ca + (-b) * sa, out_b = b * cb + a * sb, rounded as the mode says.
template <class TX, bool kHf>
__device__ inline void rotate_pair(float a, float b, float ca, float sa, float cb, float sb, float& oa, float& ob) {
  auto rt = [](float v) { return kHf ? TX::to_f32(TX::from_f32(v)) : v; };
  oa = __fadd_rn(rt(__fmul_rn(a, ca)), rt(__fmul_rn(-b, sa)));
  ob = __fadd_rn(rt(__fmul_rn(b, cb)), rt(__fmul_rn(a, sb)));
}

// Half and interleaved pairs: items [0, half) of a row are pairs, [half, half + D - R) pass-through.
template <class TX, class TC, bool kHf>
__global__ void rotary_kernel(detail::RotaryJob job, int64_t total_items) {
  using SX = typename TX::S;
  using SC = typename TC::S;
  const int64_t h = job.half, per_row = h + (job.dim - job.rot);
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < total_items;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = p / per_row, j = p - r * per_row;
    const RowAt at = row_at(job, r);
    const SX* x = static_cast<const SX*>(static_cast<const void*>(at.t->in)) + at.io;
    SX* o = static_cast<SX*>(static_cast<void*>(at.t->out)) + at.oo;
    if (j >= h) {  // a pass-through element
      const int64_t e = job.rot + (j - h);
      if (o != x) o[e] = x[e];
      continue;
    }
    int seg = 0;
    while (seg + 1 < job.segments && j >= job.seg_begin[seg + 1]) ++seg;
    const SC* c = static_cast<const SC*>(static_cast<const void*>(job.cos)) + at.co + job.seg_cos[seg];
    const SC* s = static_cast<const SC*>(static_cast<const void*>(job.sin)) + at.so + job.seg_sin[seg];
    const bool adjacent = job.pairs == RotaryPairs::interleaved;
    const int64_t ia = adjacent ? 2 * j : j, ib = adjacent ? 2 * j + 1 : h + j;  // the pair's elements
    const int64_t ta = job.pair_table ? j : ia, tb = job.pair_table ? j : ib;     // their table entries
    float oa, ob;
    rotate_pair<TX, kHf>(TX::to_f32(x[ia]), TX::to_f32(x[ib]), TC::to_f32(c[ta]), TC::to_f32(s[ta]),
                         TC::to_f32(c[tb]), TC::to_f32(s[tb]), oa, ob);
    o[ia] = TX::from_f32(oa);
    o[ib] = TX::from_f32(ob);
  }
}

// Deinterleave: one block per row (grid-stride over rows); the row's R rotated inputs go to shared
// memory (as fp32, exact) before any output is written.
template <class TX, class TC, bool kHf>
__global__ void rotary_deinterleave_kernel(detail::RotaryJob job, int64_t rows) {
  using SX = typename TX::S;
  using SC = typename TC::S;
  extern __shared__ float row[];
  const int64_t h = job.half;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const RowAt at = row_at(job, r);
    const SX* x = static_cast<const SX*>(static_cast<const void*>(at.t->in)) + at.io;
    SX* o = static_cast<SX*>(static_cast<void*>(at.t->out)) + at.oo;
    const SC* c = static_cast<const SC*>(static_cast<const void*>(job.cos)) + at.co;
    const SC* s = static_cast<const SC*>(static_cast<const void*>(job.sin)) + at.so;
    for (int64_t e = threadIdx.x; e < job.rot; e += blockDim.x) row[e] = TX::to_f32(x[e]);
    __syncthreads();
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      const float cj = TC::to_f32(c[j]), sj = TC::to_f32(s[j]);
      float oa, ob;
      rotate_pair<TX, kHf>(row[2 * j], row[2 * j + 1], cj, sj, cj, sj, oa, ob);
      o[j] = TX::from_f32(oa);
      o[h + j] = TX::from_f32(ob);
    }
    if (o != x)
      for (int64_t e = job.rot + threadIdx.x; e < job.dim; e += blockDim.x) o[e] = x[e];
    __syncthreads();  // the shared row is reused by the block's next row
  }
}


}  // namespace

void rotary(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
            const TensorView& q_out, const TensorView& k_out, const RotaryOptions& opt, CUstream_st* stream) {
  detail::RotaryJob job;
  if (!detail::make_rotary_job(q, k, cos, sin, q_out, k_out, opt, job)) return;
  const int64_t rows = job.t[0].rows + job.t[1].rows;
  const int threads = 256;
  auto launch = [&](auto tx, auto tc, auto hf) {
    using TX = decltype(tx);
    using TC = decltype(tc);
    constexpr bool kHf = decltype(hf)::value;
    if (job.pairs == RotaryPairs::deinterleave) {
      const size_t shared = static_cast<size_t>(job.rot) * sizeof(float);
      if (shared > 48 * 1024)
        throw Error("cos", "rotary: on CUDA a deinterleaved rotary dim is at most 12288 (a row in 48 KiB of shared memory), got " +
                               std::to_string(job.rot));
      const unsigned blocks = static_cast<unsigned>(rows < 65535 * 8 ? rows : 65535 * 8);
      const int bt = job.half < threads ? static_cast<int>((job.half + 31) / 32 * 32) : threads;
      rotary_deinterleave_kernel<TX, TC, kHf><<<blocks, bt, shared, stream>>>(job, rows);
    } else {
      const int64_t items = rows * (job.half + (job.dim - job.rot));
      const int64_t want = (items + threads - 1) / threads;
      const unsigned blocks = static_cast<unsigned>(want < 65535 * 8 ? want : 65535 * 8);
      rotary_kernel<TX, TC, kHf><<<blocks, threads, 0, stream>>>(job, items);
    }
  };
  with_device_dtype(job.x_dtype, [&](auto tx) {
    if (job.hf) {
      launch(tx, tx, std::true_type{});
    } else {
      with_device_dtype(job.cs_dtype, [&](auto tc) { launch(tx, tc, std::false_type{}); });
    }
  });
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("opgym::cuda::rotary: kernel launch failed: ") + cudaGetErrorString(e));
}

}  // namespace opgym::cuda
