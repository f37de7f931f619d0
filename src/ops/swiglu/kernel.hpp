// What the swiglu front hands the per-ISA CPU kernels (and the CUDA launcher): one validated call as
// rows of gate, up and out (leading dims unravelled per run of rows), the activation, and the flat
// element ranges torch's kernel computes on its scalar path (glibc's expf / tanhf: the tail of each
// inner-loop call), where they matter (fp32; 16-bit gelu_tanh).
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
  GluActivation act = GluActivation::silu;
  // Flat [begin, end) ranges over rows * dim (row-major logical order), sorted and disjoint: the
  // elements torch's kernel computes in a scalar tail (glibc's expf / tanhf).
  const int64_t* libm_ranges = nullptr;
  int64_t libm_count = 0;
  // bf16/fp16: the activation of every gate bit pattern, rounded to the dtype (65,536 entries and 2 of
  // padding, so a 4-byte gather of the last entry stays inside): as torch's vector body computes it
  // (act_table), and as its scalar tail does (tail_table, read for the lanes in libm_ranges).
  const uint16_t* act_table = nullptr;
  const uint16_t* tail_table = nullptr;
  void row_offsets(int64_t r, int64_t& go, int64_t& uo, int64_t& oo) const {
    go = uo = oo = 0;
    for (int d = lead_rank - 1; d >= 0; --d) {
      const int64_t i = r % lead_shape[d];
      r /= lead_shape[d];
      go += i * gate_lead[d], uo += i * up_lead[d], oo += i * out_lead[d];
    }
  }
};

// torch's chunks of an activation over n elements on `threads` threads (at::parallel_for with `grain`)
// and the scalar tail of each inner-loop call when its vectorized loop steps `step` elements: the libm
// ranges, as sorted pairs of flat (row-major) indices. The inner loop runs over each chunk's segments of
// `run`-element rows (run = n: one flat run per chunk, a contiguous gate; run = I: a half of a [T, 2I]
// product); run = 0: no vector body, every element.
std::vector<int64_t> torch_libm_ranges(int64_t n, int threads, int64_t step, int64_t run, int64_t grain);
// silu's grain (TensorIterator's default, 32768) and gelu's (GeluKernelImpl: numel / threads above 16384).
constexpr int64_t kTorchGrain = 32768;
inline int64_t torch_act_grain(GluActivation a, int64_t n, int threads) {
  if (a == GluActivation::gelu_tanh && n > 16384 && threads >= 1) return n / threads;
  return kTorchGrain;
}
inline std::vector<int64_t> torch_silu_libm_ranges(int64_t n, int threads, int64_t step, int64_t run) {
  return torch_libm_ranges(n, threads, step, run, kTorchGrain);
}
inline std::vector<int64_t> torch_silu_libm_ranges(int64_t n, int threads, int64_t step) {
  return torch_libm_ranges(n, threads, step, n, kTorchGrain);
}
// The run torch's TensorIterator gives its inner loop for this view of gate (GateLayout::as_given):
// gate's dims coalesced from the innermost (size-1 dims skipped) while each stride continues the block
// inside it; 0 when that block is not unit-stride (torch's basic_loop: no vector body).
int64_t torch_silu_run(const TensorView& gate);
// torch's vector step (two Vectorized<T>) on a CPU path for the activation in this dtype, where its
// tails matter: fp32 avx512 32, avx2 16; bf16/fp16 gelu_tanh avx512 64, avx2 32; 0 on the scalar path
// (no vector body) and for 16-bit silu (the two exps round alike).
int64_t torch_act_step(int isa, GluActivation a, DType t);

// torch's vector step for fp32 (two Vectorized<float>) on a CPU path: avx512 32, avx2 16, scalar 0
// (no vector body: every element is libm's).
int64_t torch_silu_fp32_step(int isa);

// The tables of a 16-bit dtype, built on first use (thread-safe). silu: g / (1 + expf(-g)) rounded to
// the dtype, one table for every path (glibc's expf, which after the rounding equals Sleef's on every
// input: tested). gelu_tanh: `vector` as the ISA's vector body (Sleef's tanh, the fma), `tail` as torch's
// scalar lambda in an FMA build (glibc's tanhf, the fma), `plain` without the fma (torch's DEFAULT build,
// opgym's scalar path).
enum class ActTable { vector, tail, plain };
const uint16_t* swiglu_act_table(DType dtype, GluActivation a, ActTable kind, int isa);

// gelu_tanh on n floats as each vector path's body computes it (fma, Sleef's tanh), for the tables
// and the tests.
void gelu_tanh_f32_avx2(const float* in, float* out, int64_t n);
void gelu_tanh_f32_avx512(const float* in, float* out, int64_t n);
// ... and as torch's scalar lambda computes it: glibc's tanhf, with or without the fma.
float gelu_tanh_libm(float g, bool fma);

void swiglu_rows_scalar(const SwigluJob& job, int64_t begin, int64_t end);
void swiglu_rows_avx2(const SwigluJob& job, int64_t begin, int64_t end);
void swiglu_rows_avx512(const SwigluJob& job, int64_t begin, int64_t end);

// The front's checks and job (without the libm ranges), shared by the CPU and CUDA fronts. Returns
// false when there is nothing to compute.
bool make_swiglu_job(const TensorView& gate, const TensorView& up, const TensorView& out, SwigluJob& job);
// gate and up as views of gate_up's halves (checks gate_up and that out has its leading shape).
void split_gate_up(const TensorView& gate_up, const TensorView& out, TensorView& gate, TensorView& up);

}  // namespace opgym::detail
