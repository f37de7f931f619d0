// AVX-512 (F, BW, VL, DQ; BF16 optional) groups of 64 floats. Compiled only in translation units
// built with the AVX-512 flags. Two layouts:
//   Simd      natural: v[k] holds elements 16k .. 16k+15. Any dtype mix.
//   SimdBf16  even/odd split, for kernels whose every tensor is bf16: one 64-byte load of 32 bf16,
//             read as 16 dwords, gives the even elements by a shift and the odd ones by a mask
//             (2 ops per 32 elements instead of 4), and stores re-interleave with one permute.
// bf16 rounding: VCVTNE2PS2BF16 (AVX512-BF16) rounds to nearest even but flushes subnormals and
// rewrites NaN payloads, so SimdBf16 uses it (and its other shortcuts) only on rows Bf16Guard has
// proven free of both; every other row, and every row without AVX512-BF16, takes the integer
// rounding, which is exact.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/simd_avx_common.hpp"
#include "core/storage.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see convert.hpp

inline void stream_fence() { _mm_sfence(); }  // order non-temporal stores before returning

// Four halvings of one vector: lanes j += j+8, j += j+4, j += j+2, then lane 0 + lane 1.
inline float fold16(__m512 v) {
  const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

// fp32 -> bf16 bits (in the high half of each dword, low half zero) by integer round-to-nearest-even;
// NaN -> 0x7fc0. Exact for every input.
inline __m512i bf16_round_high(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                                     _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7fc00000));
}

template <bool kStream> inline void store512(void* p, __m512i v) {
  if constexpr (kStream) _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
  else _mm512_storeu_si512(p, v);
}

struct Simd {
  static constexpr int kGroup = 64, kRegs = 4;
  struct G { __m512 v[kRegs]; };
  static G splat(float s) { G g; for (auto& r : g.v) r = _mm512_set1_ps(s); return g; }
  static G mul(const G& a, const G& b) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm512_mul_ps(a.v[k], b.v[k]); return g; }
  static G add(const G& a, const G& b) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm512_add_ps(a.v[k], b.v[k]); return g; }
  static G div(const G& a, const G& b) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm512_div_ps(a.v[k], b.v[k]); return g; }
  static void store_raw(float* p, const G& g) { for (int k = 0; k < kRegs; ++k) _mm512_storeu_ps(p + 16 * k, g.v[k]); }
  static G load_raw(const float* p) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm512_loadu_ps(p + 16 * k); return g; }
  // Fold by halves: +32 (v0+v2, v1+v3), +16 (the two sums), then within the vector.
  static float fold(const G& g) {
    return fold16(_mm512_add_ps(_mm512_add_ps(g.v[0], g.v[2]), _mm512_add_ps(g.v[1], g.v[3])));
  }

  template <class T> static G load(const typename T::storage* p) {
    G g;
    for (int k = 0; k < kRegs; ++k) {
      if constexpr (T::dtype == DType::float32) {
        g.v[k] = _mm512_loadu_ps(p + 16 * k);
      } else {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k));
        if constexpr (T::dtype == DType::float16) g.v[k] = _mm512_cvtph_ps(h);
        else g.v[k] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
    }
    return g;
  }
  // kStream: non-temporal stores (p must be 64-byte aligned), for outputs too large to stay cached.
  template <class T, bool kStream = false> static void store(typename T::storage* p, const G& g) {
    for (int k = 0; k < kRegs; ++k) {
      if constexpr (T::dtype == DType::float32) {
        if constexpr (kStream) _mm512_stream_ps(p + 16 * k, g.v[k]);
        else _mm512_storeu_ps(p + 16 * k, g.v[k]);
      } else {
        __m256i h;
        if constexpr (T::dtype == DType::float16) h = _mm512_cvtps_ph(g.v[k], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        else h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_round_high(g.v[k]), 16));
        if constexpr (kStream) _mm256_stream_si256(reinterpret_cast<__m256i*>(p + 16 * k), h);
        else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 16 * k), h);
      }
    }
  }
  // The first n (< kGroup) elements of a group by masked loads and stores: the other lanes read as
  // zero, nothing past n is touched (a masked-off lane cannot fault).
  static __mmask16 mask16(int64_t n, int k) {
    const int64_t c = std::min<int64_t>(16, std::max<int64_t>(0, n - 16 * k));
    return static_cast<__mmask16>((1u << c) - 1);
  }
  template <class T> static G load_n(const typename T::storage* p, int64_t n) {
    G g;
    for (int k = 0; k < kRegs; ++k) {
      const __mmask16 m = mask16(n, k);
      if constexpr (T::dtype == DType::float32) {
        g.v[k] = _mm512_maskz_loadu_ps(m, p + 16 * k);
      } else {
        const __m256i h = _mm256_maskz_loadu_epi16(m, p + 16 * k);
        if constexpr (T::dtype == DType::float16) g.v[k] = _mm512_cvtph_ps(h);
        else g.v[k] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
    }
    return g;
  }
  template <class T> static void store_n(typename T::storage* p, const G& g, int64_t n) {
    for (int k = 0; k < kRegs; ++k) {
      const __mmask16 m = mask16(n, k);
      if constexpr (T::dtype == DType::float32) {
        _mm512_mask_storeu_ps(p + 16 * k, m, g.v[k]);
      } else {
        __m256i h;
        if constexpr (T::dtype == DType::float16) h = _mm512_cvtps_ph(g.v[k], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        else h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_round_high(g.v[k]), 16));
        _mm256_mask_storeu_epi16(p + 16 * k, m, h);
      }
    }
  }
  template <class T> static G round_trip(const G& g) {
    if constexpr (T::dtype == DType::float32) {
      return g;
    } else {
      G r;
      for (int k = 0; k < kRegs; ++k) {
        if constexpr (T::dtype == DType::float16)
          r.v[k] = _mm512_cvtph_ps(_mm512_cvtps_ph(g.v[k], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        else
          r.v[k] = _mm512_castsi512_ps(bf16_round_high(g.v[k]));
      }
      return r;
    }
  }
};

// All-bf16 kernels, in the even/odd split layout: of 64 elements in four vectors, v[2h] lane j holds
// element 32h + 2j and v[2h+1] lane j element 32h + 2j + 1 (a 64-byte load read as dwords: the even
// elements by a shift, the odd ones by a mask). Everything between load and store is lane-wise, the
// weight is loaded the same way, and only the store re-interleaves (one permute per 32).
// kNative: the caller has proven the row free of NaN and of subnormal h and y (see Bf16Guard), which
// makes two shortcuts exact:
//   - round_trip (h -> bf16 -> fp32) by Veltkamp's split, c = h * (2^16 + 1), h' = c - (c - h): three
//     instructions on either FP port, no packing; round-to-nearest-even arithmetic makes h' the bf16
//     rounding of h, ties to even, for every normal |h| <= 2^100 and for +-0 (checked exhaustively
//     over those fp32 values by a throwaway loop; the unit test holds it to the scalar reference);
//     |h| <= max(2 sqrt(dim), 2^65) always holds, see Bf16Guard;
//     kZeroFree (the row has no zero x, so no zero h): two instructions instead, c = h * (2^16 - 1)
//     and h' = h * 2^16 - c in one FMA. Why it is the bf16 rounding: write h = m 2^(e-23) (m a 24-bit
//     integer) and u = 2^(e-7), the bf16 ulp at h; 2^16 h = m u exactly, and 65535 h = m u - h lies
//     in the binade of m u (where the fp32 ulp is u) once h's significand is >= 65536/65535, so c is
//     m u - h rounded to a multiple of u, ties to even; h' = 2^16 h - c is then h rounded to a
//     multiple of u, and at a tie (low 16 bits of m = 0x8000, so m even) the even choice for c is
//     the even choice for h'. Below that
//     significand h is within u/512 of 2^e, c is a multiple of u/2 and h' = 2^e. The FMA's result is
//     a bf16 value, so it is exact. Checked over every fp32 value: equal to the bf16 rounding for
//     every normal |h| <= 2^100, and wrong only for -0 (h' = +0), hence kZeroFree; ~11% fewer cycles
//     in pass 2 (docs/PERF.md, v20);
//   - the store's rounding by VCVTNE2PS2BF16 (AVX512-BF16), which flushes subnormals and rewrites
//     NaN payloads, neither of which such a row has.
// Otherwise the integer rounding, exact for every input.
template <bool kNative, bool kZeroFree = false>
struct SimdBf16 {
  static_assert(kNative || !kZeroFree, "the zero-free split is a native-path shortcut");
  static constexpr int kGroup = 64, kRegs = 4;
  using G = Simd::G;
  static G splat(float s) { return Simd::splat(s); }
  static G mul(const G& a, const G& b) { return Simd::mul(a, b); }
  static G add(const G& a, const G& b) { return Simd::add(a, b); }
  static void store_raw(float* p, const G& g) { Simd::store_raw(p, g); }
  static G load_raw(const float* p) { return Simd::load_raw(p); }
  // +32 pairs v0 with v2 and v1 with v3; +16 .. +2 stay inside the even (or odd) vector as its own
  // halvings; the last step (+1) adds the even total to the odd total. Same sums as the scalar fold.
  static float fold(const G& g) {
    return fold16(_mm512_add_ps(g.v[0], g.v[2])) + fold16(_mm512_add_ps(g.v[1], g.v[3]));
  }
  static void split2(__m512i packed, __m512& a, __m512& b) {
    a = _mm512_castsi512_ps(_mm512_slli_epi32(packed, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(packed, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  template <class T> static G load(const uint16_t* p) {
    static_assert(T::dtype == DType::bfloat16, "SimdBf16 holds bf16 only");
    G g;
    for (int h = 0; h < 2; ++h) split2(_mm512_loadu_si512(p + 32 * h), g.v[2 * h], g.v[2 * h + 1]);
    return g;
  }
  static __mmask32 mask32(int64_t n, int h) {
    const int64_t c = std::min<int64_t>(32, std::max<int64_t>(0, n - 32 * h));
    return c == 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << c) - 1);
  }
  template <class T> static G load_n(const uint16_t* p, int64_t n) {  // first n < 64 elements, rest zero
    G g;
    for (int h = 0; h < 2; ++h) split2(_mm512_maskz_loadu_epi16(mask32(n, h), p + 32 * h), g.v[2 * h], g.v[2 * h + 1]);
    return g;
  }
  template <class T> static G round_trip(const G& g) {
    static_assert(T::dtype == DType::bfloat16, "SimdBf16 holds bf16 only");
    G r;
    if constexpr (kZeroFree) {
      const __m512 below = _mm512_set1_ps(65535.0f), scale = _mm512_set1_ps(65536.0f);
      for (int k = 0; k < kRegs; ++k) r.v[k] = _mm512_fmsub_ps(g.v[k], scale, _mm512_mul_ps(g.v[k], below));
    } else if constexpr (kNative) {
      const __m512 split = _mm512_set1_ps(65537.0f);
      for (int k = 0; k < kRegs; ++k) {
        const __m512 c = _mm512_mul_ps(g.v[k], split);
        r.v[k] = _mm512_sub_ps(c, _mm512_sub_ps(c, g.v[k]));
      }
    } else {
      for (int k = 0; k < kRegs; ++k) r.v[k] = _mm512_castsi512_ps(bf16_round_high(g.v[k]));
    }
    return r;
  }
  // 32 elements (vectors 2h and 2h + 1) rounded and interleaved back into element order.
  static __m512i pack(const G& y, int h) {
    if constexpr (kNative) {
      // cvtne2ps(a, b): words 0..15 from b (even elements), 16..31 from a (odd); word q of the
      // result goes to element 2q (q < 16) or 2(q - 16) + 1.
      const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
      return _mm512_permutexvar_epi16(idx, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(y.v[2 * h + 1], y.v[2 * h])));
    } else {  // exact: odd keeps its high half, even moves its high half down
      return _mm512_or_si512(_mm512_srli_epi32(bf16_round_high(y.v[2 * h]), 16), bf16_round_high(y.v[2 * h + 1]));
    }
  }
  template <class T, bool kStream = false> static void store(uint16_t* p, const G& y) {
    static_assert(T::dtype == DType::bfloat16, "SimdBf16 holds bf16 only");
    for (int h = 0; h < 2; ++h) store512<kStream>(p + 32 * h, pack(y, h));
  }
  template <class T> static void store_n(uint16_t* p, const G& y, int64_t n) {  // first n < 64 elements
    for (int h = 0; h < 2; ++h)
      if (const __mmask32 m = mask32(n, h)) _mm512_mask_storeu_epi16(p + 32 * h, m, pack(y, h));
  }
};

// Smallest nonzero magnitude and largest magnitude of bf16 words, tracked 32 words per vector:
// (w << 1) drops the sign; minus one turns zero into 0xffff so unsigned min skips it.
struct Bf16Range {
  __m512i min_m1 = _mm512_set1_epi16(-1), max2 = _mm512_setzero_si512();
  void add(__m512i raw) {
    const __m512i m2 = _mm512_slli_epi16(raw, 1);
    min_m1 = _mm512_min_epu16(min_m1, _mm512_sub_epi16(m2, _mm512_set1_epi16(1)));
    max2 = _mm512_max_epu16(max2, m2);
  }
  static uint16_t reduce_min(__m512i v) {  // halvings, then PHMINPOSUW on the last 8 words
    const __m256i h = _mm256_min_epu16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    const __m128i q = _mm_min_epu16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    return static_cast<uint16_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(q)));
  }
  // Smallest nonzero |value| (0 if all are zero); whether any is Inf or NaN.
  float min_nonzero() const {
    const uint16_t m = reduce_min(min_m1);
    return m == 0xffff ? 0.0f : bf16_to_f32(static_cast<uint16_t>((m + 1) >> 1));
  }
  bool all_finite() const {
    return static_cast<uint16_t>(~reduce_min(_mm512_xor_si512(max2, _mm512_set1_epi16(-1)))) < (0x7f80 << 1);
  }
};

// Torch's sum order works on "ILP rows" of four 8-float vectors (32 elements); its adds are lane-wise,
// so any fixed arrangement of the 32 lanes in two zmm gives the same sums, and only `lanes8` has to
// put them back in order (vector k = elements 8k .. 8k + 7). fp32/fp16 are held in natural order (v[0] = elements
// 0..15). bf16 is held even/odd: one 64-byte load of 32 bf16 read as 16 dwords gives the even
// elements by a shift and the odd ones by a mask (2 instructions per 32 elements instead of 4, and
// no shuffle-port work), so v[0] lane j = element 2j, v[1] lane j = element 2j + 1.
struct Row32 {
  __m512 v[2];
  static Row32 zero() { const __m512 z = _mm512_setzero_ps(); return {{z, z}}; }
  static Row32 add(const Row32& a, const Row32& b) { return {{_mm512_add_ps(a.v[0], b.v[0]), _mm512_add_ps(a.v[1], b.v[1])}}; }
  template <class T> static Row32 load(const typename T::storage* p) {
    Row32 r;
    if constexpr (T::dtype == DType::bfloat16) {
      const __m512i raw = _mm512_loadu_si512(p);
      r.v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
      r.v[1] = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
    } else {
      for (int k = 0; k < 2; ++k) {
        if constexpr (T::dtype == DType::float32) r.v[k] = _mm512_loadu_ps(p + 16 * k);
        else r.v[k] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k)));
      }
    }
    return r;
  }
  // acc + x^2 for one ILP row. kFused: by FMA, one rounding instead of two, which gives the same bits
  // whenever x^2 is exact in fp32: always for fp16 x (11 significant bits, |x| >= 2^-24), for bf16 x
  // when every nonzero |x| >= 2^-63 (the caller makes sure, see rows_impl); never assumed for fp32.
  template <class T, bool kFused> static Row32 add_squares(const Row32& acc, const typename T::storage* p) {
    const Row32 x = load<T>(p);
    Row32 r;
    for (int k = 0; k < 2; ++k) {
      if constexpr (kFused && T::dtype != DType::float32) r.v[k] = _mm512_fmadd_ps(x.v[k], x.v[k], acc.v[k]);
      else r.v[k] = _mm512_add_ps(acc.v[k], _mm512_mul_ps(x.v[k], x.v[k]));
    }
    return r;
  }
  // Vectors 0 and 1, then 2 and 3, in element order (bf16: even and odd interleaved back).
  template <class T> static void natural(const Row32& r, __m512& v01, __m512& v23) {
    if constexpr (T::dtype == DType::bfloat16) {
      const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
      const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
      v01 = _mm512_permutex2var_ps(r.v[0], lo, r.v[1]);
      v23 = _mm512_permutex2var_ps(r.v[0], hi, r.v[1]);
    } else {
      v01 = r.v[0];
      v23 = r.v[1];
    }
  }
  // Torch's end of the vector part of a row: the squares of `extra` (0..3) leftover whole 8-element
  // vectors at p are added into vector 0 in order, then out[l] = ((vector 0 + vector 1) + vector 2)
  // + vector 3, lane l (8-lane adds).
  template <class T> static void lanes8(float* out, const Row32& r, const typename T::storage* p = nullptr, int64_t extra = 0) {
    __m512 v01, v23;
    natural<T>(r, v01, v23);
    const auto lo = [](__m512 v) { return _mm512_castps512_ps256(v); };
    const auto hi = [](__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); };
    const __m256 v0 = add_squares8<T>(lo(v01), p, extra);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v0, hi(v01)), lo(v23)), hi(v23)));
  }
};

// Proves, per row, that the fast path's conversions (SimdBf16<true>) are exact for it: with finite x (a finite sum of
// squares) and finite weights there is no NaN, and with min|h| = bf16(fp32(min|x| * r)) >= 2^-126 and
// min|h| * min|w| >= 2^-126 (smallest nonzero magnitudes; rounding is monotonic) no h or y is
// subnormal. A row that fails takes the exact integer rounding.
// The bound Veltkamp's split needs, |h| <= 2^100, holds for every row with a finite r (< 2^128):
// |h| > 2^100 would need |x| > 2^-28, but then x^2 > 2^-56, the sum of squares is at least fl(x^2) and
// its mean is normal, so |h| = |x| r <= sqrt(dim) (1 + 2^-21) < 2^33.
struct Bf16Guard {
  static constexpr bool kActive = true;
  bool weight_ok = false;
  float w_min = 0;
  // A row whose h = min|x| * rinv reaches this is proven without the exact test below: then
  // h >= 2^-126 and bf16(h) > h / 2 >= 2^-126 / w_min, so h and every product are normal. The common
  // row takes one multiply and one compare instead of the rounding and the double product (docs/PERF.md v25).
  float h_sure = 0;
  void weight(const uint16_t* w, int64_t dim, bool offset) {
    Bf16Range r;
    int64_t i = 0;
    for (; i + 32 <= dim; i += 32) r.add(_mm512_loadu_si512(w + i));
    if (i < dim) r.add(_mm512_maskz_loadu_epi16((__mmask32)((1ull << (dim - i)) - 1), w + i));
    weight_ok = !offset && r.all_finite();
    w_min = r.min_nonzero();
    // max(2^-126, 2^-125 / w_min) in double (at most 2^8: w_min >= 2^-133), then the next float up
    // unless exact
    const double sure = w_min > 0.0f ? std::max(0x1p-126, 0x1p-125 / w_min) : 0x1p-126;
    h_sure = static_cast<float>(sure);
    if (static_cast<double>(h_sure) < sure) h_sure = std::nextafter(h_sure, INFINITY);
  }
  // Per-row state: the minimum of |x| (the bf16 bits without the sign) over the row, zeros included
  // (see min_nonzero). A mask and an unsigned min: no shift, so it competes with nothing for port 0.
  struct Row {
    __m512i min_abs = _mm512_set1_epi16(0x7fff);
    void add(__m512i raw) { min_abs = _mm512_min_epu16(min_abs, _mm512_and_si512(raw, _mm512_set1_epi16(0x7fff))); }
    void track32(const uint16_t* x) { add(_mm512_loadu_si512(x)); }
    void track(const uint16_t* x) { track32(x), track32(x + 32); }  // a group of 64
    void track_partial(const uint16_t* x, int64_t n) {  // n <= 32; the other lanes keep their minimum
      const __mmask32 m = static_cast<__mmask32>((1ull << n) - 1);
      const __m512i a = _mm512_and_si512(_mm512_maskz_loadu_epi16(m, x), _mm512_set1_epi16(0x7fff));
      min_abs = _mm512_mask_min_epu16(min_abs, m, min_abs, a);
    }
    // Smallest nonzero |x| of the row, and whether the row holds a zero (+0 or -0). The cheap minimum
    // counts zeros; only a row holding a zero is scanned again (it is in L1) with zeros skipped.
    float min_nonzero(const uint16_t* x, int64_t dim, bool& has_zero) const {
      const uint16_t m = Bf16Range::reduce_min(min_abs);
      has_zero = m == 0;
      if (m != 0) return bf16_to_f32(m);
      Bf16Range r;
      int64_t i = 0;
      for (; i + 32 <= dim; i += 32) r.add(_mm512_loadu_si512(x + i));
      if (i < dim) r.add(_mm512_maskz_loadu_epi16((__mmask32)((1ull << (dim - i)) - 1), x + i));
      return r.min_nonzero();
    }
  };
  // In hf mode the smallest nonzero h must be normal already in fp32, not only after rounding to
  // bf16: Veltkamp's split is not the bf16 rounding of a subnormal h (0x007fbfff gives 0x007f8000,
  // where bf16 rounding gives 2^-126), and the store's VCVTNE2PS2BF16 then flushes the subnormal y
  // to 0 (tested with such a row).
  bool fast(float sum, float rinv, float xmin, bool hf) const {
    if (!weight_ok || !(sum <= 3.4e38f) || !(rinv <= 3.4e38f)) return false;
    if (xmin == 0.0f || w_min == 0.0f) return true;  // all-zero x or w: products are exact zeros
    constexpr double kMinNormal = 0x1p-126;
    float h = xmin * rinv;  // one rounding of the exact product, as the kernel's h = x * rinv
    if (h >= h_sure) return true;
    if (hf) {
      if (h < kMinNormal) return false;
      h = bf16_to_f32(f32_to_bf16(h));
    }
    return static_cast<double>(h) * w_min >= kMinNormal;
  }
};

}  // namespace
}  // namespace opgym
