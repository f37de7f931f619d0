// What the swiglu front hands the per-ISA CPU kernels (and the CUDA launcher): one validated call as
// rows of gate, up and out (leading dims unravelled per run of rows), and, for fp32, the flat element
// ranges torch's silu computes with glibc's expf (the scalar tail of each of its chunks).
#pragma once
#include <cstdint>
#include <vector>

#include "opgym/swiglu.hpp"

namespace opgym::detail {

struct SwigluJob {
  const char* gate = nullptr;
  const char* up = nullptr;
  char* out = nullptr;
  DType dtype = DType::float32;
  int64_t rows = 0, dim = 0;
  int lead_rank = 0;
  int64_t lead_shape[kMaxRank] = {}, gate_lead[kMaxRank] = {}, up_lead[kMaxRank] = {}, out_lead[kMaxRank] = {};
  // Flat [begin, end) ranges over rows * dim (row-major logical order), sorted and disjoint: the
  // elements torch's silu computes in a scalar tail (glibc's expf).
  const int64_t* libm_ranges = nullptr;
  int64_t libm_count = 0;
  // bf16/fp16: silu of every gate bit pattern, rounded to the dtype (65,536 entries and 2 of padding,
  // so a 4-byte gather of the last entry stays inside).
  const uint16_t* silu_table = nullptr;
  void row_offsets(int64_t r, int64_t& go, int64_t& uo, int64_t& oo) const {
    go = uo = oo = 0;
    for (int d = lead_rank - 1; d >= 0; --d) {
      const int64_t i = r % lead_shape[d];
      r /= lead_shape[d];
      go += i * gate_lead[d], uo += i * up_lead[d], oo += i * out_lead[d];
    }
  }
};

// torch's chunks of a silu over n elements on `threads` threads (at::parallel_for, grain 32768) and the
// scalar tail of each inner-loop call when its vectorized loop steps `step` elements: the libm ranges,
// as sorted pairs of flat (row-major) indices. The inner loop runs over each chunk's segments of `run`
// -element rows (run = n: one flat run per chunk, a contiguous gate; run = I: a half of a [T, 2I]
// product); run = 0: no vector body, every element.
std::vector<int64_t> torch_silu_libm_ranges(int64_t n, int threads, int64_t step, int64_t run);
inline std::vector<int64_t> torch_silu_libm_ranges(int64_t n, int threads, int64_t step) {
  return torch_silu_libm_ranges(n, threads, step, n);
}
// The run torch's TensorIterator gives its inner silu loop for this view of gate (SiluLayout::as_given):
// gate's dims coalesced from the innermost (size-1 dims skipped) while each stride continues the block
// inside it; 0 when that block is not unit-stride (torch's basic_loop: no vector body).
int64_t torch_silu_run(const TensorView& gate);
// torch's vector step for fp32 (two Vectorized<float>) on a CPU path: avx512 32, avx2 16, scalar 0
// (no vector body: every element is libm's).
int64_t torch_silu_fp32_step(int isa);

// The table for a 16-bit dtype, built on first use (thread-safe) from g / (1 + expf(-g)) rounded to
// the dtype; expf is glibc's, which after the rounding equals Sleef's on every input (tested).
const uint16_t* swiglu_silu_table(DType dtype);

void swiglu_rows_scalar(const SwigluJob& job, int64_t begin, int64_t end);
void swiglu_rows_avx2(const SwigluJob& job, int64_t begin, int64_t end);
void swiglu_rows_avx512(const SwigluJob& job, int64_t begin, int64_t end);

// The front's checks and job (without the libm ranges), shared by the CPU and CUDA fronts. Returns
// false when there is nothing to compute.
bool make_swiglu_job(const TensorView& gate, const TensorView& up, const TensorView& out, SwigluJob& job);
// gate and up as views of gate_up's halves (checks gate_up and that out has its leading shape).
void split_gate_up(const TensorView& gate_up, const TensorView& out, TensorView& gate, TensorView& up);

}  // namespace opgym::detail
