// Fused residual add + RMSNorm: sum = residual + x, out = rms_norm(sum, weight), in one pass.
//
// Numeric contract (src/ops/add_rms_norm/README.md): HF eager's decoder layer, rounding for rounding:
//   s = round_to(x.dtype, float(residual) + float(x))    (HF adds in the activations' dtype, so the
//                                                          sum is rounded BEFORE its variance is taken)
//   out = rms_norm(s, weight) under RmsNormOptions: the contract of include/opgym/rms_norm.hpp
//         (fp32 statistics, torch's CPU sum order by default, HF's rounding, torch's dtype promotion).
// x and residual have one dtype and one shape; the sum has that dtype, out the promotion of
// (weight, x). Rounding is round-to-nearest-even; NaN stays NaN.
#pragma once
#include "opgym/parallel.hpp"
#include "opgym/rms_norm.hpp"
#include "opgym/tensor.hpp"

namespace opgym {

// Validates everything, then writes sum_out = residual + x and out = rms_norm(sum_out, weight).
// Aliasing: sum_out may be residual or x itself (same data and strides), out may be x or residual
// itself; the in-place form of vLLM and FlashInfer is add_rms_norm(x, r, w, /*out=*/x, /*sum_out=*/r).
// out and sum_out must not overlap each other, and any other overlap with an input is refused.
// Throws opgym::Error naming the argument; nothing is written on error.
void add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView& weight, const TensorView& out,
                  const TensorView& sum_out, const RmsNormOptions& options = {}, Executor* executor = nullptr);

namespace reference {
// Golden: HF's eager sequence op by op: the add rounded to x's dtype into sum_out, then
// reference::rms_norm_basic_ops(sum_out, ...) in options.sum_order. Single-threaded, allocates.
void add_rms_norm_basic_ops(const TensorView& x, const TensorView& residual, const TensorView& weight,
                            const TensorView& out, const TensorView& sum_out, const RmsNormOptions& options = {});
}  // namespace reference

}  // namespace opgym

// ---- CUDA (the backend: include/opgym/cuda.hpp, docs/CUDA.md) ---------------------------------
// Defined when the library was built with CUDA (OPGYM_HAVE_CUDA=1). No CUDA header is needed:
struct CUstream_st;  // cudaStream_t is `CUstream_st*`; nullptr is the legacy default stream

namespace opgym::cuda {

// add_rms_norm on the GPU (include/opgym/add_rms_norm.hpp's contract and argument errors; the
// RMSNorm part sums in the lanes64 order, as opgym::cuda::rms_norm), enqueued on `stream`.
void add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView& weight, const TensorView& out,
                  const TensorView& sum_out, const RmsNormOptions& options = {}, CUstream_st* stream = nullptr);

}  // namespace opgym::cuda
