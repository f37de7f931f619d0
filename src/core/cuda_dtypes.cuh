// Device-side storage tags shared by every CUDA kernel: how each dtype is held and converted to and
// from fp32 (round to nearest even, NaN stays NaN, subnormals kept), as core/storage.hpp on the CPU.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "opgym/dtype.hpp"

namespace opgym::cuda {
namespace {  // NOLINT: internal linkage, one copy per translation unit

struct DF32 {
  using S = float;
  __device__ static float to_f32(float v) { return v; }
  __device__ static float from_f32(float v) { return v; }
};
struct DF16 {
  using S = unsigned short;
  __device__ static float to_f32(unsigned short v) { return __half2float(__ushort_as_half(v)); }
  __device__ static unsigned short from_f32(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
struct DBF16 {
  using S = unsigned short;
  __device__ static float to_f32(unsigned short v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  __device__ static unsigned short from_f32(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

// Calls fn(Tag{}) for the tag of a runtime dtype (host code).
template <class Fn>
void with_device_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::float16: return fn(DF16{});
    case DType::bfloat16: return fn(DBF16{});
    default: return fn(DF32{});
  }
}

}  // namespace
}  // namespace opgym::cuda
