// Golden reference for swiglu, meant to be read against HF (transformers 5.23) and torch's CPU kernels:
//
//   Qwen2MLP.forward:  down_proj(act_fn(gate_proj(x)) * up_proj(x)),  act_fn = nn.SiLU()
//   torch silu (aten/src/ATen/native/cpu/Activation.cpp), per element, in fp32 for bf16/fp16:
//       x / (1 + exp(-x))   -- Vectorized<float>::exp (Sleef u10) on the vector body,
//                              std::exp (glibc) on each chunk's scalar tail
//   then the result rounded to the dtype, and torch's mul: round(float(a) * float(b)).
//
// Op by op on materialized fp32 arrays: g = float(gate), n = -g, e = exp(n), d = 1 + e, s = g / d,
// s rounded to the dtype, p = s * float(up), p rounded. The exp per element follows the header's rule
// for the active CPU path, from its own copy of torch's chunk and row arithmetic (not the kernel's).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/storage.hpp"
#include "opgym/cpu.hpp"
#include "opgym/swiglu.hpp"
#include "ops/swiglu/kernel.hpp"

// Sleef's scalar u10 expf built for FMA hardware: the same algorithm and bits as its AVX2/AVX-512
// vector variants (the tests compare them on every path). sleef.h declares it only under
// FP_FAST_FMA (-mfma), which this file is not compiled with: it runs only where AVX2 (with FMA) is.
#if OPGYM_HAVE_SLEEF
extern "C" float Sleef_expf1_u10purecfma(float);
#endif

namespace opgym::reference {

namespace {
// Whether torch computes flat element e of n with glibc's expf: at::parallel_for's chunks (grain
// 32768, divup of n over min(threads, divup(n, grain)) chunks); inside a chunk its inner loop runs
// over each row segment (rows of `run` elements; run = n: one flat run), vectorized in whole steps.
bool torch_libm_at(int64_t e, int64_t n, int threads, int64_t step, int64_t run) {
  if (step == 0 || run == 0) return true;
  int64_t chunks = 1;
  if (n >= 32768 && threads > 1) chunks = std::min<int64_t>(threads, (n + 32767) / 32768);
  const int64_t size = (n + chunks - 1) / chunks;
  const int64_t chunk = e / size * size, row = e / run * run;
  const int64_t begin = std::max(chunk, row), end = std::min({n, chunk + size, row + run});
  return e - begin >= (end - begin) / step * step;
}

// The row torch's TensorIterator iterates for silu on this gate view (SiluLayout::as_given): dims
// merged from the innermost, size-1 ones skipped, while each stride equals the inner block's extent
// (TensorIterator::coalesce_dimensions); 0 when the innermost block is not unit-stride.
int64_t torch_run_of(const TensorView& gate) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (size, stride) of the dims larger than 1, innermost first
  for (int d = gate.rank - 1; d >= 0; --d)
    if (gate.shape[d] != 1) dims.emplace_back(gate.shape[d], gate.strides[d]);
  if (dims.empty()) return 1;
  int64_t size = dims[0].first;
  for (size_t k = 1; k < dims.size() && dims[k].second == dims[0].second * size; ++k) size *= dims[k].first;
  return dims[0].second == 1 ? size : 0;
}
}  // namespace

void swiglu_basic_ops(const TensorView& gate, const TensorView& up, const TensorView& out,
                      const SwigluOptions& opt) {
  detail::SwigluJob job;
  if (!detail::make_swiglu_job(gate, up, out, job)) return;
  const CpuIsa isa = active_cpu_isa();
  const int64_t step = isa == CpuIsa::avx512 ? 32 : isa == CpuIsa::avx2 ? 16 : 0;
  const int64_t D = job.dim, n = job.rows * D;
  const int64_t run = opt.silu_layout == SiluLayout::as_given ? torch_run_of(gate) : n;
  const DType t = job.dtype;
  std::vector<float> g(D), neg(D), e(D), d(D), s(D), u(D), p(D);
  for (int64_t r = 0; r < job.rows; ++r) {
    int64_t go, uo, oo;
    job.row_offsets(r, go, uo, oo);
    for (int64_t j = 0; j < D; ++j) g[j] = load_as_f32(t, job.gate, go + j), u[j] = load_as_f32(t, job.up, uo + j);
    for (int64_t j = 0; j < D; ++j) neg[j] = -g[j];
    for (int64_t j = 0; j < D; ++j) {
      // 16-bit dtypes: the two exps round to the same silu (tested exhaustively), Sleef's is used.
      const bool libm = step == 0 || (t == DType::float32 && torch_libm_at(r * D + j, n, opt.torch_threads, step, run));
#if OPGYM_HAVE_SLEEF
      e[j] = libm ? std::exp(neg[j]) : Sleef_expf1_u10purecfma(neg[j]);
#else
      e[j] = std::exp(neg[j]);  // built without Sleef: every path uses glibc's expf
#endif
    }
    for (int64_t j = 0; j < D; ++j) d[j] = 1.0f + e[j];
    for (int64_t j = 0; j < D; ++j) s[j] = round_to(t, g[j] / d[j]);
    for (int64_t j = 0; j < D; ++j) p[j] = s[j] * u[j];
    for (int64_t j = 0; j < D; ++j) store_from_f32(t, job.out, oo + j, p[j]);
  }
}

}  // namespace opgym::reference
