// The attn_softmax CPU kernel, written once over the core's "group of 64 floats" (S) and a per-ISA helper
// (K: torch's vector of that build, kLanes wide, its exp, its NaN-propagating max, its sum order), compiled
// per instruction set. Per row (n scores at s, the mask at m or none, out at o), three passes over an fp32
// scratch row x that stays in L1:
//   1. x = round(round(float(s) * scale) + float(m)) (each rounding to the dtype, as torch's mul and add),
//      and the running max (order-free: a max is the max; a NaN anywhere makes every output NaN either way);
//   2. x = exp(x - max) and the sum of x in torch's order: n < kLanes folds left from x[0] (torch's
//      vec_reduce_all slow path); otherwise lane l accumulates elements l, l + kLanes, ... from the first
//      vector on, the last partial vector adds into its first lanes only, then K::total's shuffle tree;
//   3. out = round(x * (1 / sum)) (one fp32 divide, as torch's `tmp_sum = 1 / tmp_sum`).
// Segments: the row's scores are columns [c, c + len); every other column of out is set to 0 (after the
// row is read: out may be scores itself).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/storage.hpp"
#include "ops/attn_softmax/kernel.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see core/convert.hpp

template <class S, class K, class T>
void attn_softmax_row(const detail::AttnSoftmaxJob& job, const typename T::storage* s, const typename T::storage* m,
                      typename T::storage* o, int64_t n, float* x) {
  using G = typename S::G;
  constexpr int64_t kG = S::kGroup;
  const float inf = std::numeric_limits<float>::infinity();
  const G scale = S::splat(job.scale);
  G mx = S::splat(-inf);
  for (int64_t j = 0; j < n; j += kG) {
    const int64_t nn = std::min(kG, n - j);
    G g = S::template round_trip<T>(S::mul(load_some<S, T>(s + j, nn), scale));
    if (m) g = S::template round_trip<T>(S::add(g, load_some<S, T>(m + j, nn)));
    S::store_raw(x + j, g);
    if (nn < kG) {  // the lanes past the row: -inf, which no max or (masked) sum sees
      std::fill(x + j + nn, x + j + kG, -inf);
      g = S::load_raw(x + j);
    }
    mx = K::max(mx, g);
  }
  const float max = K::hmax(mx);

  float sum;
  if (n < K::kLanes) {
    for (int64_t j = 0; j < n; j += kG) S::store_raw(x + j, K::exp_shifted(S::load_raw(x + j), max));
    sum = x[0];
    for (int64_t j = 1; j < n; ++j) sum += x[j];
  } else {
    typename K::Acc acc{};
    for (int64_t j = 0; j < n; j += kG) {
      const G e = K::exp_shifted(S::load_raw(x + j), max);
      S::store_raw(x + j, e);
      K::accumulate(acc, e, std::min(kG, n - j), j == 0);
    }
    sum = K::total(acc);
  }

  const G r = S::splat(1 / sum);
  for (int64_t j = 0; j < n; j += kG) store_some<S, T>(o + j, S::mul(S::load_raw(x + j), r), std::min(kG, n - j));
}

template <class S, class K, class T>
void rows_typed(const detail::AttnSoftmaxJob& job, int64_t begin, int64_t end, float* x) {
  using P = typename T::storage;
  const int in = job.lead_rank - 1;  // the innermost leading dim (none for a single row)
  for (int64_t r = begin; r < end;) {
    // A run of rows along the innermost leading dim: offsets by addition, the segment by advancing.
    int64_t so, mo, oo;
    job.row_offsets(r, so, mo, oo);
    const int64_t inner = in >= 0 ? job.lead_shape[in] : 1;
    const int64_t run = std::min<int64_t>(end - r, inner - (in >= 0 ? r % inner : 0));
    const int64_t ds = in >= 0 ? job.s_lead[in] : 0, dm = in >= 0 ? job.m_lead[in] : 0, d_o = in >= 0 ? job.o_lead[in] : 0;
    int64_t p = 0, seg = 0, c = 0, len = job.dim;
    if (job.cu) {
      p = r % job.period;
      seg = job.segment(p);
      job.segment_span(seg, c, len);
    }
    const P* s = reinterpret_cast<const P*>(job.scores) + so;
    const P* m = job.mask ? reinterpret_cast<const P*>(job.mask) + mo : nullptr;
    P* o = reinterpret_cast<P*>(job.out) + oo;
    for (int64_t k = 0; k < run; ++k, s += ds, o += d_o) {
      if (job.cu) {
        if (k > 0 && ++p == job.cu[seg + 1]) {  // the next non-empty segment (a run stays inside one [P, W])
          while (job.cu[seg + 1] <= p) ++seg;
          job.segment_span(seg, c, len);
        }
      }
      attn_softmax_row<S, K, T>(job, s + c, m ? m + c : nullptr, o + c, len, x);
      if (len < job.dim) {  // segments: the columns outside this row's own (0 in every dtype is all-zero bits)
        std::memset(o, 0, static_cast<size_t>(c) * sizeof(P));
        std::memset(o + c + len, 0, static_cast<size_t>(job.dim - c - len) * sizeof(P));
      }
      if (m) m += dm;
    }
    r += run;
  }
}

template <class S, class K>
void attn_softmax_rows_any(const detail::AttnSoftmaxJob& job, int64_t begin, int64_t end, float* scratch) {
  with_storage(job.dtype, [&](auto t) { rows_typed<S, K, decltype(t)>(job, begin, end, scratch); });
}

template <class S, class K>
void attn_softmax_exp_any(const float* x, float* y, int64_t n) {
  for (int64_t j = 0; j + S::kGroup <= n; j += S::kGroup) S::store_raw(y + j, K::exp_shifted(S::load_raw(x + j), 0.0f));
}

}  // namespace
}  // namespace opgym
