// The rotary CPU kernel, written once over a "group of 64 floats" (S) and compiled per instruction
// set. A row's two halves are taken 64 pairs at a time: both halves of x and the matching cos and sin
// are loaded before either half is stored, so out may be x itself (in place).
// hf mode rounds each product and the sum to x's dtype (S::round_trip; exact products, since two
// 16-bit floats multiply exactly in fp32); fp32 mode keeps fp32 until the store. Negation is exact.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/storage.hpp"
#include "ops/rotary/kernel.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see core/convert.hpp


template <class S, class TX, class TC, bool kHf>
void rotate_row(const detail::RotaryJob& job, const typename TX::storage* x, typename TX::storage* o,
                const typename TC::storage* c, const typename TC::storage* s) {
  using G = typename S::G;
  const int64_t h = job.half;
  const G minus = S::splat(-1.0f);
  auto rt = [](const G& g) { return kHf ? S::template round_trip<TX>(g) : g; };
  for (int seg = 0; seg < job.segments; ++seg) {
    const typename TC::storage* cs = c + job.seg_cos[seg];
    const typename TC::storage* ss = s + job.seg_sin[seg];
    const int64_t end = job.seg_begin[seg] + job.seg_len[seg];
    for (int64_t j = job.seg_begin[seg]; j < end; j += S::kGroup) {
      const int64_t n = end - j < S::kGroup ? end - j : S::kGroup;
      const G x1 = load_some<S, TX>(x + j, n), x2 = load_some<S, TX>(x + h + j, n);
      const G c1 = load_some<S, TC>(cs + j, n), c2 = load_some<S, TC>(cs + h + j, n);
      const G s1 = load_some<S, TC>(ss + j, n), s2 = load_some<S, TC>(ss + h + j, n);
      // out[j] = x1 * c1 + (-x2) * s1; out[h + j] = x2 * c2 + x1 * s2
      const G o1 = S::add(rt(S::mul(x1, c1)), rt(S::mul(S::mul(x2, minus), s1)));
      const G o2 = S::add(rt(S::mul(x2, c2)), rt(S::mul(x1, s2)));
      store_some<S, TX>(o + j, o1, n);
      store_some<S, TX>(o + h + j, o2, n);
    }
  }
}

// Rows in runs along the innermost leading dim (offsets advanced by adding strides; the row index
// is unravelled once per run, not per row).
template <class S, class TX, class TC, bool kHf>
void rows_typed(const detail::RotaryJob& job, int64_t begin, int64_t end) {
  using PX = typename TX::storage;
  using PC = typename TC::storage;
  const PC* c = reinterpret_cast<const PC*>(job.cos);
  const PC* s = reinterpret_cast<const PC*>(job.sin);
  for (int64_t r = begin; r < end;) {
    const bool is_q = r < job.t[0].rows;
    const detail::RotaryTensor& t = is_q ? job.t[0] : job.t[1];
    const int64_t row = is_q ? r : r - job.t[0].rows;
    const int64_t side_end = is_q ? job.t[0].rows : job.t[0].rows + job.t[1].rows;
    int64_t io, oo, co, so;
    t.row_offsets(row, io, oo, co, so);
    const int in = t.lead_rank - 1;  // the innermost leading dim (none for a single row)
    const int64_t inner = in >= 0 ? t.lead_shape[in] : 1;
    const int64_t run = std::min({end - r, side_end - r, inner - (in >= 0 ? row % inner : 0)});
    const int64_t dx = in >= 0 ? t.in_lead[in] : 0, dout = in >= 0 ? t.out_lead[in] : 0;
    const int64_t dc = in >= 0 ? t.cos_lead[in] : 0, ds = in >= 0 ? t.sin_lead[in] : 0;
    const PX* x = reinterpret_cast<const PX*>(t.in) + io;
    PX* o = reinterpret_cast<PX*>(t.out) + oo;
    for (int64_t n = 0; n < run; ++n)
      rotate_row<S, TX, TC, kHf>(job, x + n * dx, o + n * dout, c + co + n * dc, s + so + n * ds);
    r += run;
  }
}

template <class S>
void rotary_rows_any(const detail::RotaryJob& job, int64_t begin, int64_t end) {
  with_storage(job.x_dtype, [&](auto tx) {
    using TX = decltype(tx);
    if (job.hf) return rows_typed<S, TX, TX, true>(job, begin, end);  // the front checked cos's dtype == x's
    with_storage(job.cs_dtype, [&](auto tc) { rows_typed<S, TX, decltype(tc), false>(job, begin, end); });
  });
}

}  // namespace
}  // namespace opgym
