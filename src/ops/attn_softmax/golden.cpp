// Golden reference for attn_softmax, meant to be read against HF (transformers 5.23) and torch 2.13's CPU code:
//
//   eager_attention_forward:  attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
//                             attn_weights = attn_weights + attention_mask          (if a mask is given)
//                             attn_weights = softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
//   torch mul by a Python float (BinaryOpsKernel.cpp mul_kernel): float(a) * float(scaling), rounded;
//   torch add (alpha 1): float(a) + float(b), rounded;
//   softmax(x, dtype=float32) on the CPU (SoftMax.cpp): x.toType(float32), then _softmax, whose lastdim kernel
//   (SoftMaxKernel.cpp _vec_softmax_lastdim<float>) is, per row of n, with Vec = Vectorized<float> (L lanes):
//       max = vec::reduce_all(vec::maximum, row)       (L: 16 AVX512, 8 AVX2, 8 DEFAULT)
//       row = vec::map((x - max).exp())                (Sleef u10 on AVX2/AVX512, std::exp on DEFAULT)
//       sum = vec::reduce_all(x + y, row); sum = 1 / sum; row = vec::map(x * sum)
//   reduce_all (functional_base.h): n < L: lane 0 folded with each next element in order; else the first
//   vector, then each whole vector added lane-wise, the tail's lanes added into the first lanes (Vec::set),
//   then vec_reduce_all: AVX512 tree (lane i with i^8, then i^4, i^2, i^1), AVX2 tree (i^4, i^2, i^1), DEFAULT
//   the generic fold of lanes 0..7 in order.
//   .to(dtype): round to nearest even.
//
// Op by op on materialized fp32 arrays, one row at a time, single-threaded (torch's rows are independent).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/storage.hpp"
#include "opgym/attn_softmax.hpp"
#include "opgym/error.hpp"
#include "ops/attn_softmax/kernel.hpp"

// Sleef's scalar u10 expf built for FMA hardware: the bits of its AVX2/AVX-512 vector variants (the tests
// compare them). Declared by sleef.h only under FP_FAST_FMA (-mfma), which this file is not compiled with;
// it runs only on the AVX2 and AVX512 paths, which need FMA.
#if OPGYM_HAVE_SLEEF
extern "C" float Sleef_expf1_u10purecfma(float);
#endif

namespace opgym {

float detail::attn_softmax_golden_exp(float x, CpuIsa isa) {
#if OPGYM_HAVE_SLEEF
  return isa == CpuIsa::scalar ? std::exp(x) : Sleef_expf1_u10purecfma(x);
#else
  (void)isa;
  return std::exp(x);  // built without Sleef: every path uses glibc's expf
#endif
}

namespace reference {

namespace {

float maximum(float a, float b) {  // vec::maximum, per lane: NaN if either is
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return a > b ? a : b;
}

// torch's vec::reduce_all over v with `op` for a build of L lanes; `tree`: the AVX shuffle tree (else the
// generic in-order fold of the L lanes).
template <class Op>
float reduce_all(const std::vector<float>& v, int L, bool tree, Op op) {
  const int64_t n = static_cast<int64_t>(v.size());
  if (n < L) {
    float acc = v[0];
    for (int64_t i = 1; i < n; ++i) acc = op(acc, v[i]);
    return acc;
  }
  std::vector<float> acc(v.begin(), v.begin() + L);
  int64_t d = L;
  for (; d < n - n % L; d += L)
    for (int l = 0; l < L; ++l) acc[l] = op(acc[l], v[d + l]);
  for (int l = 0; d + l < n; ++l) acc[l] = op(acc[l], v[d + l]);  // the tail: its lanes only
  if (!tree) {
    float s = acc[0];
    for (int l = 1; l < L; ++l) s = op(s, acc[l]);
    return s;
  }
  for (int step = L / 2; step >= 1; step /= 2) {  // lane i with lane i ^ step (the shuffles), all lanes at once
    std::vector<float> next(L);
    for (int l = 0; l < L; ++l) next[l] = op(acc[l], acc[l ^ step]);
    acc = next;
  }
  return acc[0];
}

// One row of torch's fp32 softmax, as above, for the build `isa`.
void torch_softmax_fp32(const std::vector<float>& x, std::vector<float>& y, CpuIsa isa) {
  const int L = isa == CpuIsa::avx512 ? 16 : 8;
  const bool tree = isa != CpuIsa::scalar;
  const float max = reduce_all(x, L, tree, maximum);
  std::vector<float> d(x.size()), e(x.size());
  for (size_t j = 0; j < x.size(); ++j) d[j] = x[j] - max;
  for (size_t j = 0; j < x.size(); ++j) e[j] = detail::attn_softmax_golden_exp(d[j], isa);
  float sum = reduce_all(e, L, tree, [](float a, float b) { return a + b; });
  sum = 1 / sum;
  y.resize(x.size());
  for (size_t j = 0; j < x.size(); ++j) y[j] = e[j] * sum;
}

void basic_ops(const detail::AttnSoftmaxJob& job, CpuIsa isa) {
  const DType t = job.dtype;
  std::vector<float> s, a, b, f, y;
  for (int64_t r = 0; r < job.rows; ++r) {
    int64_t so, mo, oo, c, n;
    job.row_offsets(r, so, mo, oo);
    job.row_span(r, c, n);
    s.resize(n), a.resize(n), b.resize(n), f.resize(n);
    for (int64_t j = 0; j < n; ++j) s[j] = load_as_f32(t, job.scores, so + c + j);
    for (int64_t j = 0; j < n; ++j) a[j] = round_to(t, s[j] * job.scale);                  // * scaling
    for (int64_t j = 0; j < n; ++j)                                                         // + attention_mask
      b[j] = job.mask ? round_to(t, a[j] + load_as_f32(t, job.mask, mo + c + j)) : a[j];
    for (int64_t j = 0; j < n; ++j) f[j] = b[j];                                            // .to(float32)
    torch_softmax_fp32(f, y, isa);                                                          // _softmax
    for (int64_t j = 0; j < job.dim; ++j)                                                   // .to(dtype)
      store_from_f32(t, job.out, oo + j, j >= c && j < c + n ? y[j - c] : 0.0f);
  }
}

}  // namespace

void attn_softmax_basic_ops(const TensorView& scores, const TensorView& out, const AttnSoftmaxOptions& options) {
  detail::AttnSoftmaxJob job;
  if (!detail::make_attn_softmax_job(scores, out, options, nullptr, 0, false, job)) return;
  basic_ops(job, detail::attn_softmax_isa(options));
}

void attn_softmax_segments_basic_ops(const TensorView& scores, const TensorView& out, const int64_t* cu_seqlens,
                                     int64_t segments, bool block_diagonal, const AttnSoftmaxOptions& options) {
  if (!cu_seqlens) throw Error("cu_seqlens", "attn_softmax: cu_seqlens is null");
  detail::AttnSoftmaxJob job;
  if (!detail::make_attn_softmax_job(scores, out, options, cu_seqlens, segments, block_diagonal, job)) return;
  basic_ops(job, detail::attn_softmax_isa(options));
}

}  // namespace reference
}  // namespace opgym
