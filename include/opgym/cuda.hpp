// The CUDA backend: the same operators on NVIDIA GPUs, with the same numeric contract and the same
// argument errors as the CPU path. No torch types; data pointers are device pointers (or managed).
//
// Present in the library when it was built with CUDA (the build defines OPGYM_HAVE_CUDA=1 for the
// library and everything that links it; cmake/cuda.cmake). This header needs no CUDA header:
// `cudaStream_t` is `CUstream_st*`, declared here the way cuda_runtime_api.h declares it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "opgym/rms_norm.hpp"
#include "opgym/rotary.hpp"
#include "opgym/swiglu.hpp"
#include "opgym/tensor.hpp"

struct CUstream_st;  // cudaStream_t is `CUstream_st*`; nullptr is the legacy default stream

namespace opgym::cuda {

// How many CUDA devices this process can use; 0 when there is no driver or no GPU (never throws).
// `why`, when given, receives the CUDA error text in that case.
int device_count(std::string* why = nullptr);

// The strategy a call uses, derived from the shape, dtypes and pointer alignment (nothing is
// declared ahead). Pure host logic: it runs without a GPU.
enum class RmsNormKernel {
  warp_rows,         // one warp per row, 4 rows per block, the row held in registers (dim <= 2048)
  block_row_smem,    // one block per row, the row staged in shared memory: one read, one write
  block_row_global,  // one block per row when the row exceeds shared memory: x is read twice
};
const char* kernel_name(RmsNormKernel k);

struct RmsNormPlan {
  RmsNormKernel kernel = RmsNormKernel::warp_rows;
  int64_t rows = 0, dim = 0;
  bool rows_collapse = true;  // leading dims collapse to one row stride (x and out)
  // warp_rows: elements each lane loads per access (2 when x, weight and out are all aligned to two
  // elements on every row, else 1), and the register capacity per lane (4, 16 or 64 elements).
  // block_row_*: the 16-byte vector width of x (elements); the per-row scalar prefix up to the
  // first aligned element and the scalar tail are computed on the device from each row's address.
  int vec = 1;
  int elems_per_lane = 0;
  int threads = 0;           // per block
  int64_t blocks = 0;        // grid; blocks loop over rows when rows exceed it
  size_t smem_bytes = 0;     // dynamic shared memory per block
  std::string describe() const;
};

// `max_smem_bytes`: the device's opt-in shared memory per block (0: assume 48 KiB, the default).
// Validates x only (as the CPU planner does).
RmsNormPlan plan_rms_norm(const TensorView& x, const TensorView& weight, const TensorView& out,
                          size_t max_smem_bytes = 0);

// RMSNorm on the GPU, enqueued on `stream`; returns without waiting. Same contract as
// opgym::rms_norm (hf order by default; the fp32 sum of squares uses the kSumLanes order, so the
// result is bit-identical to the CPU path on finite inputs). `out` may be `x` itself.
// Argument errors throw opgym::Error with the CPU front's messages before anything is launched;
// a failed launch throws std::runtime_error naming the CUDA error. Safe to capture in a CUDA graph:
// no allocation, no synchronization, no host-device copies.
void rms_norm(const TensorView& x, const TensorView& weight, const TensorView& out,
              const RmsNormOptions& options = {}, CUstream_st* stream = nullptr);

// add_rms_norm on the GPU (include/opgym/add_rms_norm.hpp's contract and argument errors; the
// RMSNorm part sums in the lanes64 order, as rms_norm above), enqueued on `stream`.
void add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView& weight, const TensorView& out,
                  const TensorView& sum_out, const RmsNormOptions& options = {}, CUstream_st* stream = nullptr);

// rotary on the GPU (include/opgym/rotary.hpp's contract, the same bits as the CPU: elementwise, no
// sum order), enqueued on `stream`.
void rotary(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
            const TensorView& q_out, const TensorView& k_out, const RotaryOptions& options = {},
            CUstream_st* stream = nullptr);

// swiglu on the GPU (include/opgym/swiglu.hpp's contract with torch's CUDA silu: expf and an IEEE
// divide in fp32; the argument errors of the CPU front), enqueued on `stream`.
void swiglu(const TensorView& gate, const TensorView& up, const TensorView& out, CUstream_st* stream = nullptr);
void swiglu_merged(const TensorView& gate_up, const TensorView& out, CUstream_st* stream = nullptr);

}  // namespace opgym::cuda
