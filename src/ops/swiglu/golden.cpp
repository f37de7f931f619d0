// Golden reference for swiglu (silu and gelu_tanh), meant to be read against HF (transformers 5.23) and
// torch's CPU kernels (gelu_tanh: aten/src/ATen/native/cpu/Gelu.h, GeluKernelImpl):
//
//   Qwen2MLP.forward:  down_proj(act_fn(gate_proj(x)) * up_proj(x)),  act_fn = nn.SiLU()
//   torch silu (aten/src/ATen/native/cpu/Activation.cpp), per element, in fp32 for bf16/fp16:
//       x / (1 + exp(-x))   -- Vectorized<float>::exp (Sleef u10) on the vector body,
//                              std::exp (glibc) on each chunk's scalar tail
//   GemmaMLP.forward: the same with act_fn = GELUTanh, torch's gelu(approximate="tanh"), in fp32:
//       (0.5 * x) * (1 + tanh(beta * (x + kappa * (x * x * x))))  -- Vectorized<float>::tanh (Sleef
//       u10) on the vector body, std::tanh (glibc) on the tail; `kappa * x3 + x` an fma wherever
//       torch's build has FMA (its AVX2 and AVX-512 kernels, vector body and tail: measured)
//   then the result rounded to the dtype, and torch's mul: round(float(a) * float(b)).
//
// Op by op on materialized fp32 arrays: silu: g = float(gate), n = -g, e = exp(n), d = 1 + e,
// s = g / d; gelu_tanh: x3 = g * g * g, i = beta * fma(kappa, x3, g), t = tanh(i), s = (0.5 * g) *
// (1 + t); s rounded to the dtype, p = s * float(up), p rounded. The exp / tanh per element follows the
// header's rule for the active CPU path, from its own copy of torch's chunk and row arithmetic (not the
// kernel's).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/storage.hpp"
#include "opgym/cpu.hpp"
#include "opgym/swiglu.hpp"
#include "ops/swiglu/kernel.hpp"

// Sleef's scalar u10 expf and tanhf built for FMA hardware: the same algorithm and bits as its
// AVX2/AVX-512 vector variants (the tests compare them on every path). sleef.h declares it only under
// FP_FAST_FMA (-mfma), which this file is not compiled with: it runs only where AVX2 (with FMA) is.
#if OPGYM_HAVE_SLEEF
extern "C" float Sleef_expf1_u10purecfma(float);
extern "C" float Sleef_tanhf1_u10purecfma(float);
#endif

namespace opgym::reference {

namespace {
// Whether torch computes flat element e of n on its scalar path (glibc): at::parallel_for's chunks
// (divup of n over min(threads, divup(n, grain)) chunks; grain 32768 for silu, n / threads for gelu
// above 16384 elements); inside a chunk its inner loop runs over each row segment (rows of `run`
// elements; run = n: one flat run), vectorized in whole steps.
bool torch_libm_at(int64_t e, int64_t n, int threads, int64_t step, int64_t run, bool gelu) {
  if (step == 0 || run == 0) return true;
  const int64_t grain = gelu && n > 16384 ? std::max<int64_t>(1, n / std::max(threads, 1)) : 32768;
  int64_t chunks = 1;
  if (n >= grain && threads > 1) chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
  const int64_t size = (n + chunks - 1) / chunks;
  const int64_t chunk = e / size * size, row = e / run * run;
  const int64_t begin = std::max(chunk, row), end = std::min({n, chunk + size, row + run});
  return e - begin >= (end - begin) / step * step;
}

// The row torch's TensorIterator iterates for silu on this gate view (GateLayout::as_given): dims
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
  const bool gelu = opt.activation == GluActivation::gelu_tanh, vec_fma = isa != CpuIsa::scalar;
  const DType t = job.dtype;
  // torch's vector step: two Vectorized<T>; 16-bit ones hold twice fp32's lanes
  const int64_t step = (isa == CpuIsa::avx512 ? 32 : isa == CpuIsa::avx2 ? 16 : 0) * (t == DType::float32 ? 1 : 2);
  const int64_t D = job.dim, n = job.rows * D;
  const int64_t run = opt.gate_layout == GateLayout::as_given ? torch_run_of(gate) : n;
  const float beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
  std::vector<float> g(D), a(D), b(D), c(D), s(D), u(D), p(D);
  std::vector<char> libm(D);
  for (int64_t r = 0; r < job.rows; ++r) {
    int64_t go, uo, oo;
    job.row_offsets(r, go, uo, oo);
    for (int64_t j = 0; j < D; ++j) g[j] = load_as_f32(t, job.gate, go + j), u[j] = load_as_f32(t, job.up, uo + j);
    for (int64_t j = 0; j < D; ++j) {
      // silu in 16-bit: the two exps round to the same value (tested exhaustively), Sleef's is used.
      libm[j] = step == 0 || ((t == DType::float32 || gelu) && torch_libm_at(r * D + j, n, opt.torch_threads, step,
                                                                              run, gelu));
    }
    if (!gelu) {
      for (int64_t j = 0; j < D; ++j) a[j] = -g[j];
      for (int64_t j = 0; j < D; ++j) {
#if OPGYM_HAVE_SLEEF
        b[j] = libm[j] ? std::exp(a[j]) : Sleef_expf1_u10purecfma(a[j]);
#else
        b[j] = std::exp(a[j]);  // built without Sleef: every path uses glibc's expf
#endif
      }
      for (int64_t j = 0; j < D; ++j) c[j] = 1.0f + b[j];
      for (int64_t j = 0; j < D; ++j) s[j] = round_to(t, g[j] / c[j]);
    } else {
      // x3 = g * g * g; inner = beta * (kappa * x3 + g), fused on the vector paths (torch's scalar
      // lambda there is compiled with FMA contraction too); tanh; (0.5 * g) * (1 + tanh)
      for (int64_t j = 0; j < D; ++j) a[j] = g[j] * g[j] * g[j];
      for (int64_t j = 0; j < D; ++j) b[j] = beta * (vec_fma ? std::fma(kappa, a[j], g[j]) : g[j] + kappa * a[j]);
      for (int64_t j = 0; j < D; ++j) {
#if OPGYM_HAVE_SLEEF
        c[j] = libm[j] ? std::tanh(b[j]) : Sleef_tanhf1_u10purecfma(b[j]);
#else
        c[j] = std::tanh(b[j]);  // built without Sleef: every path uses glibc's tanhf
#endif
      }
      for (int64_t j = 0; j < D; ++j) s[j] = round_to(t, (0.5f * g[j]) * (1.0f + c[j]));
    }
    for (int64_t j = 0; j < D; ++j) p[j] = s[j] * u[j];
    for (int64_t j = 0; j < D; ++j) store_from_f32(t, job.out, oo + j, p[j]);
  }
}

}  // namespace opgym::reference
