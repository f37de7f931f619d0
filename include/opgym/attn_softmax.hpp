// attn_softmax: the attention core between HF eager attention's two matmuls, in one pass.
//
// HF (transformers 5.23, eager_attention_forward) computes, on the scores s = q @ k^T (q's dtype):
//     a = s * scaling                    torch's mul: round(float(s) * float(scaling))
//     b = a + attention_mask             torch's add: round(float(a) + float(mask))      (when a mask is given)
//     w = softmax(b, -1, dtype=float32)  on the CPU: b.to(float32), then the fp32 lastdim softmax kernel
//     w = w.to(q.dtype)                  round to nearest even
// attn_softmax gives those bits for float32, float16 and bfloat16 (for fp32 every rounding is the identity).
// The softmax is torch's CPU `_vec_softmax_lastdim<float>` step for step: a NaN-propagating max, e = exp(x - max)
// with the exp of torch's build, the sum of e in torch's lane order (its vector width, the tail lanes, the final
// shuffle tree), one fp32 divide 1 / sum, each e multiplied by it. Which torch build (and so which lane order and
// exp) is `torch_isa`: AVX512 (16 lanes, Sleef's expf16_u10), AVX2 (8 lanes, Sleef's expf8_u10) or torch's DEFAULT
// build (8 lanes folded in order, glibc's expf) = CpuIsa::scalar; the three give different bits, and torch uses
// the best its CPU has (ATEN_CPU_CAPABILITY forces another). src/ops/attn_softmax/README.md has the evidence.
// Rows are independent in torch (no thread count enters the bits). NaN outputs are NaN where torch's are; their
// payloads are not part of the contract (torch's own depend on its compiler's operand order).
// CUDA (opgym::cuda::attn_softmax below): torch's CUDA softmax (expf, e / sum) within 1 ulp, not bit for bit.
#pragma once
#include <cstdint>
#include <optional>

#include "opgym/cpu.hpp"
#include "opgym/parallel.hpp"
#include "opgym/tensor.hpp"

struct CUstream_st;

namespace opgym {

struct AttnSoftmaxOptions {
  // HF's `scaling` (a Python float) as torch's mul converts it: to fp32, round to nearest (static_cast).
  float scale = 1.0f;
  // The additive mask (HF's attention_mask), scores' dtype and rank; each dim equal to scores' or 1
  // (broadcast, as HF's [B, 1, Sq, Sk] mask over the heads); last dim contiguous unless 1. Null: no mask.
  const TensorView* mask = nullptr;
  // Whose softmax to reproduce: torch's AVX512 build, its AVX2 build, or its DEFAULT build (scalar). Unset:
  // opgym's active ISA (opgym::active_cpu_isa). The torch operator passes the capability torch itself runs.
  // The CPU must support it (opgym::Error naming torch_isa otherwise).
  std::optional<CpuIsa> torch_isa;
};

// out = HF's four statements above on scores. scores and out: one dtype and shape (rank >= 1, softmax over the
// last dim), any leading strides, last dim contiguous. out may be scores itself (in place); any other overlap of
// out with scores or the mask is refused. Throws opgym::Error naming the argument; nothing is written on error.
void attn_softmax(const TensorView& scores, const TensorView& out, const AttnSoftmaxOptions& options = {},
                  Executor* executor = nullptr);

// Many attention segments (the vision tower's windows, or images) in one buffer and one call. scores and out
// [..., P, W] (rank >= 2): the rows of segment i are p in [cu_seqlens[i], cu_seqlens[i+1]) and its L_i =
// cu_seqlens[i+1] - cu_seqlens[i] scores sit in columns [c_i, c_i + L_i) of each of its rows, c_i = 0 (packed:
// W >= the longest segment) or c_i = cu_seqlens[i] (block_diagonal: W >= P, HF's full [P, P] scores). Each row
// gets HF's sequence without a mask over its L_i columns, as HF's per-window eager_attention_forward computes
// it; every other column of out is set to 0 (so the whole of out is defined). cu_seqlens: `segments` + 1
// non-decreasing entries from 0 to P. options.mask must be null.
void attn_softmax_segments(const TensorView& scores, const TensorView& out, const int64_t* cu_seqlens,
                           int64_t segments, bool block_diagonal, const AttnSoftmaxOptions& options = {},
                           Executor* executor = nullptr);

// Which exp the vector paths use: "sleef-u10" (torch's), or "glibc" when built without Sleef (then the AVX2 and
// AVX-512 paths differ from torch in the last bit of some exps).
const char* attn_softmax_exp_library();

namespace reference {
// Golden: HF's statements one by one on materialized fp32 arrays (the product, its rounding, the sum with the
// mask, its rounding, the fp32 softmax as torch's code reads for the chosen build: max, exp, the lane-ordered
// sum written out element by element, 1 / sum, the products), single-threaded. Same checks as the front.
void attn_softmax_basic_ops(const TensorView& scores, const TensorView& out, const AttnSoftmaxOptions& options = {});
void attn_softmax_segments_basic_ops(const TensorView& scores, const TensorView& out, const int64_t* cu_seqlens,
                                     int64_t segments, bool block_diagonal, const AttnSoftmaxOptions& options = {});
}  // namespace reference

namespace cuda {
// attn_softmax on the GPU (present when the library was built with CUDA; opgym/cuda.hpp's conventions): the
// same arguments and errors, torch's CUDA softmax semantics (max, e = expf(x - max), the fp32 sum, e / sum),
// within 1 ulp of torch's, not bit for bit (torch's CUDA sum order is its block's). Enqueued on `stream`.
// Unverified on a GPU so far.
void attn_softmax(const TensorView& scores, const TensorView& out, const AttnSoftmaxOptions& options = {},
                  CUstream_st* stream = nullptr);
}  // namespace cuda

}  // namespace opgym
