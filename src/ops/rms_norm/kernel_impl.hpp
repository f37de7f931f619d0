// The RMSNorm CPU kernel, written once over a "group of 64 floats" (S::G) and compiled once per
// instruction set (kernel_scalar.cpp, kernel_avx2.cpp, kernel_avx512.cpp). Include after a simd_*.hpp.
//
// Why it is shaped this way:
// - Two passes over a row: sum of squares, then scale and store. A transformer row (<= 16 KiB in
//   bf16) stays in L1/L2 between the passes, so memory sees one read and one write per element.
// - Products and sums are separate roundings (mul then add; the build sets -ffp-contract=off) because
//   HF materializes x.pow(2) in fp32 before summing. An explicit FMA is used only where the square is
//   exact, so one rounding equals those two (fp16 squares; bf16 ones on the guarded path, see
//   Row32::add_squares and rows_impl).
// - Element i adds into lane i mod 64 on every ISA and the 64 lanes fold by halves, so scalar, AVX2
//   and AVX-512 give the same bits, and the basic-op golden can reproduce them. 64 lanes are four
//   independent AVX-512 add chains: pass 1 runs at load speed instead of add latency.
// - The weight is converted to fp32 (with the Gemma offset folded in) once per call, not per row.
// - Short rows (per-head 128) are taken in batches of up to 16: all sums first, then the divides and
//   square roots, then all scaling, so each row's serial fold/sqrt/divide latency overlaps the others.
// - Long rows streamed from L3 or memory (RmsNormJob::overlap) instead scale row r - 1 inside the sum
//   pass of row r (torch_order_sum's hook), so reads, adds, scaling and writes run together.
// - A Guard may prove a row safe for a faster, inexact-in-general conversion (AVX512-BF16); a row it
//   cannot prove takes the exact path. NoGuard: the path's conversions are exact everywhere.
// - A row's last partial group (dim not a multiple of 64) is read with the missing lanes as zero
//   (zeros add nothing to the sum) and only its valid elements are written: masked loads and stores
//   on AVX-512, a zero-padded stack group elsewhere (S::load_n / S::store_n). No heap.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/rms_norm/kernel.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see core/convert.hpp

using detail::kRowBatch;
// Lambdas of the row loops that must be inlined: out of line, each call spills the vector registers.
#define OPGYM_INLINE __attribute__((always_inline))
constexpr int64_t kWeightBuf = 4096;        // weights pre-converted when dim <= this (16 KiB) ...
constexpr int64_t kWeightBufRows = 4;       // ... and the call has this many rows to amortize it
constexpr int64_t kPrefetchRowBytes = 8 * 1024;  // rows at least this long prefetch the next row

struct NoGuard {
  static constexpr bool kActive = false;
  template <class P> void weight(const P*, int64_t, bool) {}
  struct Row {
    template <class P> void track(const P*) {}
    template <class P> void track32(const P*) {}
    template <class P> void track_partial(const P*, int64_t) {}
    template <class P> float min_nonzero(const P*, int64_t, bool& has_zero) const { return has_zero = true, 0.0f; }
  };
  bool fast(float, float, float, bool) const { return false; }
};

// Torch's CPU sum of x^2 over a row (ATen SumKernel.cpp, cascade_sum -> vectorized_inner_sum ->
// row_sum -> multi_row_sum) with its 8-float vectors: ILP rows of four vectors (32 elements) go into
// accumulator level 0; every `step` ILP rows level 0 is added into level 1 and cleared, and so on up
// to 4 levels; the levels are then added into level 0, leftover whole vectors into its first vector,
// its four vectors summed left to right; the scalar tail is summed from 0, then the 8 lanes are added
// to it in order. A row shorter than one vector takes row_sum on scalars (4-way ILP).
// (Written from the algorithm; checked against torch bit for bit by the pytest precision suite.)
inline int64_t ceil_log2(int64_t n) {
  int64_t r = 0;
  while ((int64_t{1} << r) < n) ++r;
  return r;
}

// R rows of equal length at once: each row's adds stay in its own order, and the rows' independent
// add chains fill the pipeline (one row alone has only two 16-lane chains on AVX-512).
// Torch's last step, total = tail + lane 0 + ... + lane 7, is a chain of eight dependent adds per
// row; it is left to finish_sums (simd_*.hpp), which runs it for eight rows at once after a
// transpose. A row hands over its scalar tail sum and its 8 lanes (lanes[r], 32-byte aligned).
// hook(i) runs after ILP row i (32 elements) of the rows has been added: the overlapped mode of
// rows_impl scales the previous row there, a group every second ILP row.
struct NoHook {
  void operator()(int64_t) const {}
};
template <class TX, int R, bool kFused, class Track, class Hook = NoHook>
void torch_order_sum(const typename TX::storage* const* xp, int64_t dim, Track* trackp, float* tails, float (*lanes)[8],
                     Hook&& hook = {}) {
  // Local copies: the hook's stores (vector types may alias anything) would otherwise make every ILP
  // row reload the row pointers and store the trackers back.
  const typename TX::storage* x[R];
  Track track[R];
  for (int r = 0; r < R; ++r) x[r] = xp[r], track[r] = trackp[r];
  constexpr int64_t kW = 8;
  auto sq = [&](int r, int64_t i) { const float v = TX::to_f32(x[r][i]); return v * v; };
  if (dim < kW) {  // scalar row_sum: 4 partials over whole quads, the rest into partial 0
    for (int r = 0; r < R; ++r) {
      float p[4] = {0.f, 0.f, 0.f, 0.f};
      const int64_t quads = dim / 4;
      for (int64_t i = 0; i < quads; ++i)
        for (int k = 0; k < 4; ++k) p[k] += sq(r, 4 * i + k);
      for (int64_t i = quads * 4; i < dim; ++i) p[0] += sq(r, i);
      track[r].track_partial(x[r], dim);
      tails[r] = ((p[0] + p[1]) + p[2]) + p[3];
      for (int l = 0; l < kW; ++l) lanes[r][l] = 0.0f;  // + 0 leaves a sum of squares (never -0) as it is
      trackp[r] = track[r];
    }
    return;
  }
  const int64_t vecs = dim / kW, rows = vecs / 4;
  const int64_t power = std::max<int64_t>(4, ceil_log2(rows) / 4), step = int64_t{1} << power, mask = step - 1;
  Row32 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < 4; ++l) acc[r][l] = Row32::zero();
  auto add_row = [&](int64_t i) OPGYM_INLINE {
    for (int r = 0; r < R; ++r) {
      acc[r][0] = Row32::template add_squares<TX, kFused>(acc[r][0], x[r] + 32 * i);
      track[r].track32(x[r] + 32 * i);
    }
    hook(i);
  };
  int64_t i = 0;
  int top = 0;  // the highest level written; those above it hold zeros, which add nothing to a sum of squares
  while (i + step <= rows) {
    for (int64_t j = 0; j < step; ++j, ++i) add_row(i);
    for (int lev = 1; lev < 4; ++lev) {
      for (int r = 0; r < R; ++r) {
        acc[r][lev] = Row32::add(acc[r][lev], acc[r][lev - 1]);
        acc[r][lev - 1] = Row32::zero();
      }
      top = std::max(top, lev);
      if ((i & (mask << (lev * power))) != 0) break;
    }
  }
  for (; i < rows; ++i) add_row(i);
  for (int r = 0; r < R; ++r) {
    for (int lev = 1; lev <= top; ++lev) acc[r][0] = Row32::add(acc[r][0], acc[r][lev]);
    // leftover whole vectors (vecs not a multiple of 4) go into vector 0 first
    Row32::template lanes8<TX>(lanes[r], acc[r][0], x[r] + rows * 32, vecs - rows * 4);
    float tail = 0.f;
    for (int64_t t = vecs * kW; t < dim; ++t) tail += sq(r, t);
    if (rows * 32 < dim) track[r].track_partial(x[r] + rows * 32, dim - rows * 32);
    tails[r] = tail;
    trackp[r] = track[r];
  }
}

// S: the fast group ops; SExact: the exact ones; SZeroFree: the fast ones for a row the Guard has
// also seen hold no zero x (all three the same type unless a Guard is active).
template <class S, class SExact, class SZeroFree, class Guard, class TX, class TW, class TO, bool kHf>
void rows_impl(const detail::RmsNormJob& job, int64_t begin, int64_t end) {
  using SX = typename TX::storage;
  using SW = typename TW::storage;
  using SO = typename TO::storage;
  using G = typename S::G;
  constexpr int kG = S::kGroup;
  const int64_t dim = job.dim, body = dim - dim % kG, tail = dim - body;
  const SW* w = reinterpret_cast<const SW*>(job.w);
  const bool offset = job.weight_offset;
  const int batch = detail::batch_rows(dim, sizeof(SX));

  // Tail scratch, zero-padded; the weight tail is loaded once per call.
  alignas(64) SX xt[kG];
  alignas(64) SW wt[kG];
  std::memset(wt, 0, sizeof wt);
  if (tail) std::memcpy(wt, w + body, tail * sizeof(SW));

  // The weight in fp32, in the group layout, offset applied: once per call when it fits.
  alignas(64) float wbuf[kWeightBuf + kG];
  const bool wconv = dim <= kWeightBuf && end - begin >= kWeightBufRows;
  auto weight_group = [&](const SW* wp) {  // in the layout of S (see SimdBf16)
    G wv = S::template load<TW>(wp);
    if (offset) wv = S::add(wv, S::splat(1.0f));
    return wv;
  };
  if (wconv) {
    for (int64_t i = 0; i < body; i += kG) S::store_raw(wbuf + i, weight_group(w + i));
    if (tail) S::store_raw(wbuf + body, weight_group(wt));
  }
  Guard guard;
  guard.weight(w, dim, offset);

  auto row_ptrs = [&](int64_t r, const SX*& x, SO*& out) {
    int64_t xo, oo;
    job.row_offsets(r, xo, oo);
    x = reinterpret_cast<const SX*>(job.x) + xo;
    out = reinterpret_cast<SO*>(job.out) + oo;
  };
  auto load_tail = [&](const SX* x) {
    std::memset(xt, 0, sizeof xt);
    std::memcpy(xt, x + body, tail * sizeof(SX));
  };
  // Long rows come from L3 or DRAM: while a row is scaled (a write stream), the next row's reads
  // are started, so pass 1 of the next row finds it in cache instead of waiting on memory.
  const bool prefetch = dim * static_cast<int64_t>(sizeof(SX)) >= kPrefetchRowBytes;
  // Pass 2 over the full groups of one row from element i0 to i1 (multiples of kG), and its partial
  // last group when `with_tail`, with the group ops Sx (S, SExact or SZeroFree: one layout).
  auto scale_range = [&](auto sx, auto stream, const SX* x, SO* out, float rinv, int64_t i0, int64_t i1,
                         bool with_tail, const SX* next) OPGYM_INLINE {
    using Sx = decltype(sx);
    constexpr bool kStream = decltype(stream)::value;
    const G ri = Sx::splat(rinv);
    auto scale = [&](const G& xg, int64_t i, const SW* wp) OPGYM_INLINE {
      G h = Sx::mul(xg, ri);
      if constexpr (kHf) h = Sx::template round_trip<TX>(h);
      return Sx::mul(wconv ? Sx::load_raw(wbuf + i) : weight_group(wp), h);
    };
    for (int64_t i = i0; i < i1; i += kG) {
      if (next)
        for (int64_t b = 0; b < static_cast<int64_t>(kG * sizeof(SX)); b += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(next + i) + b, 0, 3);
      Sx::template store<TO, kStream>(out + i, scale(Sx::template load<TX>(x + i), i, w + i));
    }
    if (with_tail && tail)
      Sx::template store_n<TO>(out + body, scale(Sx::template load_n<TX>(x + body, tail), body, wt), tail);
  };
  // HF's rsqrt(mean(x^2) + eps) in fp32, as torch's CPU computes it: 1 / sqrt (see golden.cpp).
  auto rinv_of = [&](float sum) OPGYM_INLINE { return 1.0f / std::sqrt(sum / static_cast<float>(dim) + job.eps); };
  // Which group ops pass 2 of a row may use: 2 the zero-free fast ones, 1 the fast ones, 0 exact.
  auto variant_of = [&](float sum, float rinv, float xmin, bool xzero) {
    if constexpr (Guard::kActive) {
      if (guard.fast(sum, rinv, xmin, kHf)) return kHf && !xzero ? 2 : 1;  // only hf mode rounds h
    }
    (void)sum, (void)rinv, (void)xmin, (void)xzero;
    return 0;
  };
  // f(group ops, stream tag) for a row's variant and output alignment.
  auto with_ops = [&](int variant, SO* out, auto&& f) OPGYM_INLINE {
    const bool stream = job.stream_out && (reinterpret_cast<uintptr_t>(out) & 63) == 0;
    auto go = [&](auto sx) OPGYM_INLINE {
      if (stream) f(sx, std::true_type{});
      else f(sx, std::false_type{});
    };
    if (variant == 2) go(SZeroFree{});
    else if (variant == 1) go(S{});
    else go(SExact{});
  };

  // Squares added by FMA where that is exact (Row32::add_squares): fp16 always; bf16 where the Guard
  // tracks the smallest |x|, and a row holding a nonzero |x| < 2^-63 is summed again the plain way.
  constexpr bool kFusedBf16 = TX::dtype == DType::bfloat16 && Guard::kActive;
  constexpr bool kFused = TX::dtype == DType::float16 || kFusedBf16;
  // A fused sum (torch's order) of a bf16 row holding a nonzero |x| < 2^-63 may differ from torch's:
  // that row is summed again with two roundings per square.
  auto resum_if_tiny = [&](const SX* x, float xmin, float& sum) {
    if constexpr (kFusedBf16) {
      if (xmin != 0.0f && xmin < 0x1p-63f) {
        typename Guard::Row unused;
        alignas(32) float tl[1], ln[1][8];
        torch_order_sum<TX, 1, false>(&x, dim, &unused, tl, ln);
        finish_sums(1, tl, ln, &sum);
      }
    }
    (void)x, (void)xmin, (void)sum;
  };
  // A row's sum of squares, its smallest nonzero |x| (Guard) and whether it holds a zero, in torch's
  // order, with `hook` run between its ILP rows.
  auto sum_row = [&](const SX* x, float& sum, float& xmin, bool& xzero, auto&& hook) OPGYM_INLINE {
    typename Guard::Row track;
    alignas(32) float tl[1], ln[1][8];
    torch_order_sum<TX, 1, kFused>(&x, dim, &track, tl, ln, hook);
    finish_sums(1, tl, ln, &sum);
    xmin = track.min_nonzero(x, dim, xzero);
    resum_if_tiny(x, xmin, sum);
  };
  if (job.overlap && job.torch_order && begin < end) {
    // Overlapped mode, for rows streamed from L3 or memory: pass 2 of row r - 1 runs inside pass 1 of
    // row r (a group after every second ILP row), so the next row's reads and add chains overlap the
    // previous row's scaling and its write stream instead of taking turns (docs/PERF.md, v23).
    const SX* px = nullptr;
    SO* pout = nullptr;
    float prinv = 0.0f;
    int pvariant = 0;
    const int64_t groups = body / kG;
    for (int64_t r = begin; r <= end; ++r) {
      const SX* x = nullptr;
      SO* out = nullptr;
      if (r < end) row_ptrs(r, x, out);
      float sum = 0.0f, xmin = 0.0f;
      bool xzero = false;
      if (!px) {
        sum_row(x, sum, xmin, xzero, NoHook{});
      } else {
        with_ops(pvariant, pout, [&](auto sx, auto stream) OPGYM_INLINE {
          int64_t g = 0;
          auto hook = [&](int64_t i) OPGYM_INLINE {
            if ((i & 1) && g < groups) scale_range(sx, stream, px, pout, prinv, g * kG, (g + 1) * kG, false, nullptr), ++g;
          };
          if (x) sum_row(x, sum, xmin, xzero, hook);
          scale_range(sx, stream, px, pout, prinv, g * kG, body, true, nullptr);
        });
      }
      if (!x) break;
      const float rinv = rinv_of(sum);
      px = x, pout = out, prinv = rinv, pvariant = variant_of(sum, rinv, xmin, xzero);
    }
    if (job.stream_out) stream_fence();
    return;
  }

  float sums[kRowBatch], rinv[kRowBatch], xmin[kRowBatch];
  bool xzero[kRowBatch];
  for (int64_t r0 = begin; r0 < end; r0 += batch) {
    const int n = static_cast<int>(std::min<int64_t>(batch, end - r0));
    // pass 1: sums of squares
    typename Guard::Row track[kRowBatch];
    const SX* xs[kRowBatch];
    SO* outs[kRowBatch];
    for (int k = 0; k < n; ++k) row_ptrs(r0 + k, xs[k], outs[k]);
    if (job.torch_order) {
      alignas(32) float tails[kRowBatch], lanes[kRowBatch][8];
      int k = 0;
      for (; k + 2 <= n; k += 2) torch_order_sum<TX, 2, kFused>(xs + k, dim, track + k, tails + k, lanes + k);
      if (k < n) torch_order_sum<TX, 1, kFused>(xs + k, dim, track + k, tails + k, lanes + k);
      finish_sums(n, tails, lanes, sums);
    } else {
      for (int k = 0; k < n; ++k) {
        const SX* x = xs[k];
        G acc = S::splat(0.0f);
        for (int64_t i = 0; i < body; i += kG) {
          const G v = S::template load<TX>(x + i);
          acc = S::add(acc, S::mul(v, v));
          track[k].track(x + i);
        }
        if (tail) {
          load_tail(x);
          const G v = S::template load<TX>(xt);
          acc = S::add(acc, S::mul(v, v));
          track[k].track(xt);
        }
        sums[k] = S::fold(acc);
      }
    }
    for (int k = 0; k < n; ++k) xmin[k] = track[k].min_nonzero(xs[k], dim, xzero[k]);
    if (job.torch_order)
      for (int k = 0; k < n; ++k) resum_if_tiny(xs[k], xmin[k], sums[k]);
    for (int k = 0; k < n; ++k) rinv[k] = rinv_of(sums[k]);
    for (int k = 0; k < n; ++k) {  // pass 2: scale, round, store
      const SX* next = nullptr;  // the row at this position in the next batch
      if (prefetch && r0 + n + k < end) {
        SO* unused;
        row_ptrs(r0 + n + k, next, unused);
      }
      with_ops(variant_of(sums[k], rinv[k], xmin[k], xzero[k]), outs[k], [&](auto sx, auto stream) OPGYM_INLINE {
        scale_range(sx, stream, xs[k], outs[k], rinv[k], 0, body, true, next);
      });
    }
  }
  if (job.stream_out) stream_fence();
}

template <bool kHf>
void dispatch_rows(const detail::RmsNormJob& job, int64_t begin, int64_t end) {
  with_storage(job.x_dtype, [&](auto tx) {
    with_storage(job.w_dtype, [&](auto tw) {
      using TX = decltype(tx);
      using TW = decltype(tw);
      if (job.out_dtype == DType::float32) {
        rows_impl<Simd, Simd, Simd, NoGuard, TX, TW, F32, kHf>(job, begin, end);
      } else if constexpr (TX::dtype == TW::dtype) {
#ifdef OPGYM_SIMD_BF16
        if constexpr (TX::dtype == DType::bfloat16) {  // every tensor bf16: the split layout
          if (job.native_bf16)
            rows_impl<SimdBf16<true>, SimdBf16<false>, SimdBf16<true, true>, Bf16Guard, TX, TW, TX, kHf>(job, begin, end);
          else
            rows_impl<SimdBf16<false>, SimdBf16<false>, SimdBf16<false>, NoGuard, TX, TW, TX, kHf>(job, begin, end);
          return;
        }
#endif
        rows_impl<Simd, Simd, Simd, NoGuard, TX, TW, TX, kHf>(job, begin, end);
      }
    });
  });
}

void rows_any(const detail::RmsNormJob& job, int64_t begin, int64_t end) {
  if (job.mode == NormMode::hf) dispatch_rows<true>(job, begin, end);
  else dispatch_rows<false>(job, begin, end);
}

// This path's vector conversion fp32 -> `to` over n (a multiple of 64) values: lets the tests hold
// every path's rounding to the scalar reference on ties, subnormals, overflow and NaN.
void round_f32_any(DType to, const float* in, void* out, int64_t n) {
  with_storage(to, [&](auto tag) {
    using T = decltype(tag);
    auto* o = static_cast<typename T::storage*>(out);
    for (int64_t i = 0; i + Simd::kGroup <= n; i += Simd::kGroup) Simd::template store<T>(o + i, Simd::template load<F32>(in + i));
  });
}

}  // namespace
}  // namespace opgym
