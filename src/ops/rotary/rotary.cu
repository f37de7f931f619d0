// rotary on NVIDIA GPUs: the contract of opgym::rotary (include/opgym/rotary.hpp) and the CPU front's
// argument errors (detail::make_rotary_job builds the same job). One thread per (row, j) pair of a
// row's halves: it reads x[j], x[j + D/2] and the matching cos/sin (the MRoPE stream chosen per j),
// writes both outputs, so in place is exact. Products and sums are separate roundings (__fmul_rn,
// __fadd_rn, -fmad=false); the hf mode rounds each to the dtype as the CPU does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/cuda_dtypes.cuh"
#include "opgym/rotary.hpp"
#include "ops/rotary/kernel.hpp"

namespace opgym::cuda {

namespace {


template <class TX, class TC, bool kHf>
__global__ void rotary_kernel(detail::RotaryJob job, int64_t total_pairs) {
  using SX = typename TX::S;
  using SC = typename TC::S;
  const int64_t h = job.half;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < total_pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = p / h;
    const int64_t j = p - r * h;
    const int side = r < job.t[0].rows ? 0 : 1;
    const detail::RotaryTensor& t = job.t[side];
    if (side) r -= job.t[0].rows;
    int64_t io = 0, oo = 0, co = 0, so = 0;
    for (int d = t.lead_rank - 1; d >= 0; --d) {
      const int64_t i = r % t.lead_shape[d];
      r /= t.lead_shape[d];
      io += i * t.in_lead[d], oo += i * t.out_lead[d], co += i * t.cos_lead[d], so += i * t.sin_lead[d];
    }
    int seg = 0;
    while (seg + 1 < job.segments && j >= job.seg_begin[seg + 1]) ++seg;
    const SX* x = static_cast<const SX*>(static_cast<const void*>(t.in)) + io;
    SX* o = static_cast<SX*>(static_cast<void*>(t.out)) + oo;
    const SC* c = static_cast<const SC*>(static_cast<const void*>(job.cos)) + co + job.seg_cos[seg];
    const SC* s = static_cast<const SC*>(static_cast<const void*>(job.sin)) + so + job.seg_sin[seg];
    const float x1 = TX::to_f32(x[j]), x2 = TX::to_f32(x[h + j]);
    auto rt = [](float v) { return kHf ? TX::to_f32(TX::from_f32(v)) : v; };
    const float o1 = __fadd_rn(rt(__fmul_rn(x1, TC::to_f32(c[j]))), rt(__fmul_rn(-x2, TC::to_f32(s[j]))));
    const float o2 = __fadd_rn(rt(__fmul_rn(x2, TC::to_f32(c[h + j]))), rt(__fmul_rn(x1, TC::to_f32(s[h + j]))));
    o[j] = TX::from_f32(o1);
    o[h + j] = TX::from_f32(o2);
  }
}


}  // namespace

void rotary(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
            const TensorView& q_out, const TensorView& k_out, const RotaryOptions& opt, CUstream_st* stream) {
  detail::RotaryJob job;
  if (!detail::make_rotary_job(q, k, cos, sin, q_out, k_out, opt, job)) return;
  const int64_t pairs = (job.t[0].rows + job.t[1].rows) * job.half;
  const int threads = 256;
  const int64_t want = (pairs + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 8 ? want : 65535 * 8);
  with_device_dtype(job.x_dtype, [&](auto tx) {
    using TX = decltype(tx);
    if (job.hf) {
      rotary_kernel<TX, TX, true><<<blocks, threads, 0, stream>>>(job, pairs);
    } else {
      with_device_dtype(job.cs_dtype, [&](auto tc) {
        rotary_kernel<TX, decltype(tc), false><<<blocks, threads, 0, stream>>>(job, pairs);
      });
    }
  });
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("opgym::cuda::rotary: kernel launch failed: ") + cudaGetErrorString(e));
}

}  // namespace opgym::cuda
