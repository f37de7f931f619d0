// The rotary CPU kernel, written once over a "group of 64 floats" (S) and compiled per instruction
// set. Pairs are taken 64 at a time: both elements of each pair and the matching cos and sin are
// loaded before either output is stored, so out may be x itself (in place).
// - half pairs read the two halves of the rotary dim as they lie;
// - interleaved pairs are gathered (even and odd elements of the group's 128) into scratch groups,
//   rotated, and scattered back to the same places;
// - deinterleave (adjacent pairs in, halves out) gathers the whole rotated part of a row first (its
//   outputs land where later pairs are still to be read, in place).
// Dims [R, D) are copied unless the row is rotated in place. hf mode rounds each product and the sum
// to x's dtype (S::round_trip; exact products, since two 16-bit floats multiply exactly in fp32); fp32
// mode keeps fp32 until the store. Negation is exact.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/storage.hpp"
#include "ops/rotary/kernel.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see core/convert.hpp

// n <= kGroup pairs: out_a = a * ca + (-b) * sa, out_b = b * cb + a * sb (every load before a store).
template <class S, class TX, class TC, bool kHf>
inline void rotate_group(const typename TX::storage* a, const typename TX::storage* b, const typename TC::storage* ca,
                         const typename TC::storage* sa, const typename TC::storage* cb,
                         const typename TC::storage* sb, typename TX::storage* oa, typename TX::storage* ob,
                         int64_t n) {
  using G = typename S::G;
  auto rt = [](const G& g) { return kHf ? S::template round_trip<TX>(g) : g; };
  const G x1 = load_some<S, TX>(a, n), x2 = load_some<S, TX>(b, n);
  const G c1 = load_some<S, TC>(ca, n), s1 = load_some<S, TC>(sa, n);
  const G c2 = cb == ca ? c1 : load_some<S, TC>(cb, n), s2 = sb == sa ? s1 : load_some<S, TC>(sb, n);
  const G o1 = S::add(rt(S::mul(x1, c1)), rt(S::mul(S::mul(x2, S::splat(-1.0f)), s1)));
  const G o2 = S::add(rt(S::mul(x2, c2)), rt(S::mul(x1, s2)));
  store_some<S, TX>(oa, o1, n);
  store_some<S, TX>(ob, o2, n);
}

// Scratch for adjacent pairs: one group of gathered pairs and tables, and (deinterleave) a whole row.
template <class TX, class TC>
struct PairScratch {
  typename TX::storage a[64], b[64];
  typename TC::storage ca[64], cb[64], sa[64], sb[64];
  std::vector<typename TX::storage> row_a, row_b;
};

template <class S, class TX, class TC, bool kHf>
void rotate_row(const detail::RotaryJob& job, const typename TX::storage* x, typename TX::storage* o,
                const typename TC::storage* c, const typename TC::storage* s, PairScratch<TX, TC>& w) {
  static_assert(S::kGroup == 64, "the scratch holds one group of 64");
  const int64_t h = job.half;
  if (job.pairs == RotaryPairs::half) {
    for (int seg = 0; seg < job.segments; ++seg) {
      const typename TC::storage* cs = c + job.seg_cos[seg];
      const typename TC::storage* ss = s + job.seg_sin[seg];
      const int64_t end = job.seg_begin[seg] + job.seg_len[seg];
      const int64_t second = job.pair_table ? 0 : h;  // where pair j's second element reads its table
      for (int64_t j = job.seg_begin[seg]; j < end; j += S::kGroup) {
        const int64_t n = std::min<int64_t>(end - j, S::kGroup);
        rotate_group<S, TX, TC, kHf>(x + j, x + h + j, cs + j, ss + j, cs + second + j, ss + second + j, o + j,
                                     o + h + j, n);
      }
    }
  } else if (job.pairs == RotaryPairs::interleaved) {
    for (int64_t j = 0; j < h; j += S::kGroup) {
      const int64_t n = std::min<int64_t>(h - j, S::kGroup);
      const typename TX::storage* xg = x + 2 * j;
      for (int64_t i = 0; i < n; ++i) w.a[i] = xg[2 * i], w.b[i] = xg[2 * i + 1];
      const typename TC::storage *ca = c + j, *sa = s + j, *cb = ca, *sb = sa;
      if (!job.pair_table) {
        const typename TC::storage *cg = c + 2 * j, *sg = s + 2 * j;
        for (int64_t i = 0; i < n; ++i)
          w.ca[i] = cg[2 * i], w.cb[i] = cg[2 * i + 1], w.sa[i] = sg[2 * i], w.sb[i] = sg[2 * i + 1];
        ca = w.ca, cb = w.cb, sa = w.sa, sb = w.sb;
      }
      rotate_group<S, TX, TC, kHf>(w.a, w.b, ca, sa, cb, sb, w.a, w.b, n);
      typename TX::storage* og = o + 2 * j;
      for (int64_t i = 0; i < n; ++i) og[2 * i] = w.a[i], og[2 * i + 1] = w.b[i];
    }
  } else {  // deinterleave (pair tables only)
    if (static_cast<int64_t>(w.row_a.size()) < h) w.row_a.resize(h), w.row_b.resize(h);
    for (int64_t i = 0; i < h; ++i) w.row_a[i] = x[2 * i], w.row_b[i] = x[2 * i + 1];
    for (int64_t j = 0; j < h; j += S::kGroup) {
      const int64_t n = std::min<int64_t>(h - j, S::kGroup);
      rotate_group<S, TX, TC, kHf>(w.row_a.data() + j, w.row_b.data() + j, c + j, s + j, c + j, s + j, o + j,
                                   o + h + j, n);
    }
  }
  if (o != x && job.dim > job.rot)
    std::memcpy(o + job.rot, x + job.rot, static_cast<size_t>(job.dim - job.rot) * sizeof(*x));
}

// Rows in runs along the innermost leading dim (offsets advanced by adding strides; the row index
// is unravelled once per run, not per row).
template <class S, class TX, class TC, bool kHf>
void rows_typed(const detail::RotaryJob& job, int64_t begin, int64_t end) {
  using PX = typename TX::storage;
  using PC = typename TC::storage;
  const PC* c = reinterpret_cast<const PC*>(job.cos);
  const PC* s = reinterpret_cast<const PC*>(job.sin);
  PairScratch<TX, TC> scratch;
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
      rotate_row<S, TX, TC, kHf>(job, x + n * dx, o + n * dout, c + co + n * dc, s + so + n * ds, scratch);
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
