// swiglu on NVIDIA GPUs: the contract of opgym::swiglu (include/opgym/swiglu.hpp) with torch's CUDA
// silu, `x / (1 + ::exp(-x))` in fp32 (expf, IEEE divide: -prec-div=true), or its gelu(approximate=
// "tanh") (tanhf, the multiply-add nvcc contracts fused), rounded to the dtype, then torch's mul
// (unverified on a GPU so far). The front's argument errors (detail::make_swiglu_job builds the same job).
// Each thread takes 8 consecutive elements of a row: one 16-byte load of gate and of up and one
// 16-byte store when the row's three pointers are 16-byte aligned and the row is a multiple of 8
// (checked on the host for the whole call), else element by element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "core/cuda_dtypes.cuh"
#include "opgym/error.hpp"
#include "opgym/swiglu.hpp"
#include "ops/swiglu/kernel.hpp"

namespace opgym::cuda {

namespace {

// torch's CUDA gelu(approximate="tanh") (GeluCUDAKernelImpl) in fp32: kBeta * (x + kKappa * x_cube)
// with the multiply-add fused (nvcc's default -fmad contracts torch's), tanhf, 0.5 * x * (1 + t).
__device__ __forceinline__ float gelu_tanh_f32(float g) {
  const float beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
  const float x3 = __fmul_rn(__fmul_rn(g, g), g);
  const float inner = __fmul_rn(beta, __fmaf_rn(kappa, x3, g));
  return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner)));
}

template <class T, GluActivation kAct>
__device__ __forceinline__ float act_mul(float g, float u) {
  float a;
  if constexpr (kAct == GluActivation::gelu_tanh) a = gelu_tanh_f32(g);
  else a = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  return __fmul_rn(T::to_f32(T::from_f32(a)), u);
}

template <class T, bool kVec, GluActivation kAct>
__global__ void swiglu_kernel(detail::SwigluJob job, int64_t per_row, int64_t total) {
  using S = typename T::S;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < total;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = p / per_row;
    const int64_t j0 = (p - r * per_row) * (kVec ? 8 : 1);
    int64_t go = 0, uo = 0, oo = 0;
    for (int d = job.lead_rank - 1; d >= 0; --d) {
      const int64_t i = r % job.lead_shape[d];
      r /= job.lead_shape[d];
      go += i * job.gate_lead[d], uo += i * job.up_lead[d], oo += i * job.out_lead[d];
    }
    const S* g = reinterpret_cast<const S*>(job.gate) + go + j0;
    const S* u = reinterpret_cast<const S*>(job.up) + uo + j0;
    S* o = reinterpret_cast<S*>(job.out) + oo + j0;
    if constexpr (kVec) {
      constexpr int kN = 16 / sizeof(S);  // 8 for 16-bit types, 4 for fp32 (two loads)
      for (int h = 0; h < 8; h += kN) {
        const uint4 gv = *reinterpret_cast<const uint4*>(g + h), uv = *reinterpret_cast<const uint4*>(u + h);
        const S* ge = reinterpret_cast<const S*>(&gv);
        const S* ue = reinterpret_cast<const S*>(&uv);
        uint4 ov;
        S* oe = reinterpret_cast<S*>(&ov);
#pragma unroll
        for (int k = 0; k < kN; ++k) oe[k] = T::from_f32(act_mul<T, kAct>(T::to_f32(ge[k]), T::to_f32(ue[k])));
        *reinterpret_cast<uint4*>(o + h) = ov;
      }
    } else {
      o[0] = T::from_f32(act_mul<T, kAct>(T::to_f32(g[0]), T::to_f32(u[0])));
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

void swiglu(const TensorView& gate, const TensorView& up, const TensorView& out, CUstream_st* stream,
            GluActivation activation) {
  if (activation != GluActivation::silu && activation != GluActivation::gelu_tanh)
    throw Error("activation", "swiglu: activation must be silu or gelu_tanh, got " +
                                  std::to_string(static_cast<int>(activation)));
  detail::SwigluJob job;
  if (!detail::make_swiglu_job(gate, up, out, job)) return;
  const int64_t es = static_cast<int64_t>(dtype_size(job.dtype));
  bool vec = job.dim % 8 == 0 && aligned16(job.gate) && aligned16(job.up) && aligned16(job.out);
  for (int d = 0; d < job.lead_rank && vec; ++d)
    vec = (job.gate_lead[d] * es) % 16 == 0 && (job.up_lead[d] * es) % 16 == 0 && (job.out_lead[d] * es) % 16 == 0;
  const int64_t per_row = vec ? job.dim / 8 : job.dim, total = job.rows * per_row;
  const int threads = 256;
  const int64_t want = (total + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 8 ? want : 65535 * 8);
  with_device_dtype(job.dtype, [&](auto t) {
    using T = decltype(t);
    constexpr GluActivation kS = GluActivation::silu, kG = GluActivation::gelu_tanh;
    const bool gelu = activation == kG;
    if (vec && gelu) swiglu_kernel<T, true, kG><<<blocks, threads, 0, stream>>>(job, per_row, total);
    else if (vec) swiglu_kernel<T, true, kS><<<blocks, threads, 0, stream>>>(job, per_row, total);
    else if (gelu) swiglu_kernel<T, false, kG><<<blocks, threads, 0, stream>>>(job, per_row, total);
    else swiglu_kernel<T, false, kS><<<blocks, threads, 0, stream>>>(job, per_row, total);
  });
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("opgym::cuda::swiglu: kernel launch failed: ") + cudaGetErrorString(e));
}

void swiglu_merged(const TensorView& gate_up, const TensorView& out, CUstream_st* stream, GluActivation activation) {
  TensorView gate, up;
  detail::split_gate_up(gate_up, out, gate, up);
  swiglu(gate, up, out, stream, activation);
}

}  // namespace opgym::cuda
