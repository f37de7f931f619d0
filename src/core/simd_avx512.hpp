// AVX-512 (F, BW, VL, DQ; BF16 optional) groups of 64 floats. Compiled only in translation units
// built with the AVX-512 flags. Two layouts:
//   Simd      natural: v[k] holds elements 16k .. 16k+15. Any dtype mix.
//   SimdBf16  even/odd split, for kernels whose every tensor is bf16: one 64-byte load of 32 bf16,
//             read as 16 dwords, gives the even elements by a shift and the odd ones by a mask
//             (2 ops per 32 elements instead of 4), and stores re-interleave with one permute.
// bf16 rounding: VCVTNEPS2BF16 (AVX512-BF16) rounds to nearest even but flushes subnormals and
// rewrites NaN payloads, so every group is checked with VFPCLASSPS and a group holding a subnormal
// or NaN takes the integer rounding, which is exact. Without AVX512-BF16 the integer rounding is
// used throughout.
#pragma once
#include <immintrin.h>

#include <cstdint>

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

// Lanes the hardware bf16 conversion would get wrong: NaN (payload) and subnormal (flushed).
inline __mmask16 needs_exact(__m512 f) { return _mm512_fpclass_ps_mask(f, 0x01 | 0x80 | 0x20); }

struct Simd {
  static constexpr int kGroup = 64, kRegs = 4;
  struct G { __m512 v[kRegs]; };
  static G splat(float s) { G g; for (auto& r : g.v) r = _mm512_set1_ps(s); return g; }
  static G mul(const G& a, const G& b) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm512_mul_ps(a.v[k], b.v[k]); return g; }
  static G add(const G& a, const G& b) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm512_add_ps(a.v[k], b.v[k]); return g; }
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
  template <class T, bool kRt = false> static G load_w(const typename T::storage* p) { return load<T>(p); }
  // kStream: non-temporal stores (p must be 64-byte aligned), for outputs too large to stay cached.
  template <class T, bool kRt = false, bool kStream = false> static void store(typename T::storage* p, const G& g) {
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

// All-bf16 kernels. Two lane orders, both of 64 elements in four vectors (per 32 elements: two):
//   load order  v[2h] lane j = element 32h + 2j, v[2h+1] lane j = element 32h + 2j + 1 (a 64-byte load
//               read as dwords: even elements by a shift, odd ones by a mask);
//   rt order    what rounding in load order then splitting again gives without a permute:
//               v[2h] lanes 0..7 = elements 4j, lanes 8..15 = 4j+1; v[2h+1]: 4j+2 and 4j+3.
// In hf mode h is rounded (round_trip: load order -> rt order), so the weight is taken in rt order and
// y is stored from it; in fp32 mode everything stays in load order. Only the store permutes.
// kNative: AVX512-BF16 conversions, which the caller may choose only for rows it has proven free of
// NaN and subnormal results (see Bf16Guard).
template <bool kNative>
struct SimdBf16 {
  static constexpr int kGroup = 64, kRegs = 4;
  using G = Simd::G;
  static G splat(float s) { return Simd::splat(s); }
  static G mul(const G& a, const G& b) { return Simd::mul(a, b); }
  static G add(const G& a, const G& b) { return Simd::add(a, b); }
  static void store_raw(float* p, const G& g) { Simd::store_raw(p, g); }
  static G load_raw(const float* p) { return Simd::load_raw(p); }
  // +32 pairs v0 with v2 and v1 with v3; +16 .. +2 stay inside the even (or odd) vector as its own
  // halvings; the last step (+1) adds the even total to the odd total. Same sums as the scalar fold.
  // (Only pass 1 folds, always in load order.)
  static float fold(const G& g) {
    return fold16(_mm512_add_ps(g.v[0], g.v[2])) + fold16(_mm512_add_ps(g.v[1], g.v[3]));
  }
  static void split2(__m512i packed, __m512& a, __m512& b) {
    a = _mm512_castsi512_ps(_mm512_slli_epi32(packed, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(packed, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  // load order <-> rt order (for the exact path and for the weight; the fast path never needs it)
  static G load_to_rt(const G& g) {
    const __m512i ia = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i ib = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    G r;
    for (int h = 0; h < 2; ++h) {
      r.v[2 * h] = _mm512_permutex2var_ps(g.v[2 * h], ia, g.v[2 * h + 1]);
      r.v[2 * h + 1] = _mm512_permutex2var_ps(g.v[2 * h], ib, g.v[2 * h + 1]);
    }
    return r;
  }
  static G rt_to_load(const G& g) {
    const __m512i ie = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i io = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    G r;
    for (int h = 0; h < 2; ++h) {
      r.v[2 * h] = _mm512_permutex2var_ps(g.v[2 * h], ie, g.v[2 * h + 1]);
      r.v[2 * h + 1] = _mm512_permutex2var_ps(g.v[2 * h], io, g.v[2 * h + 1]);
    }
    return r;
  }
  template <class T> static G load(const uint16_t* p) {
    static_assert(T::dtype == DType::bfloat16, "SimdBf16 holds bf16 only");
    G g;
    for (int h = 0; h < 2; ++h) split2(_mm512_loadu_si512(p + 32 * h), g.v[2 * h], g.v[2 * h + 1]);
    return g;
  }
  // The weight in the order pass 2 multiplies in: rt order in hf mode, load order in fp32 mode.
  template <class T, bool kRt> static G load_w(const uint16_t* p) {
    const G g = load<T>(p);
    if constexpr (kRt) return load_to_rt(g);
    else return g;
  }
  template <class T> static G round_trip(const G& g) {  // load order in, rt order out
    static_assert(T::dtype == DType::bfloat16, "SimdBf16 holds bf16 only");
    G r;
    if constexpr (kNative) {
      // cvtne2ps2bf16(a, b): words 0..15 from b, 16..31 from a; as dwords (word 2d+1 : word 2d).
      for (int h = 0; h < 2; ++h) {
        const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(g.v[2 * h + 1], g.v[2 * h]));
        split2(packed, r.v[2 * h], r.v[2 * h + 1]);
      }
      return r;
    } else {
      for (int k = 0; k < kRegs; ++k) r.v[k] = _mm512_castsi512_ps(bf16_round_high(g.v[k]));
      return load_to_rt(r);
    }
  }
  // Stores y given in rt order (kRt) or load order.
  template <class T, bool kRt, bool kStream = false> static void store(uint16_t* p, const G& y) {
    static_assert(T::dtype == DType::bfloat16, "SimdBf16 holds bf16 only");
    if constexpr (kNative) {
      // Packed word q holds: load order q<16: element 2q, else 2(q-16)+1;
      //                      rt order q = 8m + j: element 4j + m.
      const __m512i idx = kRt ? _mm512_set_epi16(31, 23, 15, 7, 30, 22, 14, 6, 29, 21, 13, 5, 28, 20, 12, 4,
                                                 27, 19, 11, 3, 26, 18, 10, 2, 25, 17, 9, 1, 24, 16, 8, 0)
                              : _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
      for (int h = 0; h < 2; ++h) {
        const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(y.v[2 * h + 1], y.v[2 * h]));
        store512<kStream>(p + 32 * h, _mm512_permutexvar_epi16(idx, packed));
      }
    } else {
      const G g = kRt ? rt_to_load(y) : y;
      for (int h = 0; h < 2; ++h) {  // exact: odd keeps its high half, even moves its high half down
        const __m512i e = _mm512_srli_epi32(bf16_round_high(g.v[2 * h]), 16);
        store512<kStream>(p + 32 * h, _mm512_or_si512(e, bf16_round_high(g.v[2 * h + 1])));
      }
    }
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
// so any fixed arrangement of the 32 lanes in two zmm gives the same sums, and only `store` has to
// put them back (ps[8k + lane] = vector k). fp32/fp16 are held in natural order (v[0] = elements
// 0..15). bf16 is held even/odd: one 64-byte load of 32 bf16 read as 16 dwords gives the even
// elements by a shift and the odd ones by a mask (2 instructions per 32 elements instead of 4, and
// no shuffle-port work), so v[0] lane j = element 2j, v[1] lane j = element 2j + 1.
struct Row32 {
  __m512 v[2];
  static Row32 zero() { const __m512 z = _mm512_setzero_ps(); return {{z, z}}; }
  static Row32 add(const Row32& a, const Row32& b) { return {{_mm512_add_ps(a.v[0], b.v[0]), _mm512_add_ps(a.v[1], b.v[1])}}; }
  template <class T> static Row32 squares(const typename T::storage* p) {
    Row32 r;
    if constexpr (T::dtype == DType::bfloat16) {
      const __m512i raw = _mm512_loadu_si512(p);
      const __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
      const __m512 o = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
      r.v[0] = _mm512_mul_ps(e, e);
      r.v[1] = _mm512_mul_ps(o, o);
      return r;
    }
    for (int k = 0; k < 2; ++k) {
      __m512 x;
      if constexpr (T::dtype == DType::float32) x = _mm512_loadu_ps(p + 16 * k);
      else x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k)));
      r.v[k] = _mm512_mul_ps(x, x);
    }
    return r;
  }
  template <class T> static void store(float* out, const Row32& r) {
    if constexpr (T::dtype == DType::bfloat16) {  // interleave even and odd back into element order
      const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
      const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
      _mm512_storeu_ps(out, _mm512_permutex2var_ps(r.v[0], lo, r.v[1]));
      _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(r.v[0], hi, r.v[1]));
    } else {
      _mm512_storeu_ps(out, r.v[0]);
      _mm512_storeu_ps(out + 16, r.v[1]);
    }
  }
};

// Proves, per row, that AVX512-BF16's conversions are exact for it: with finite x (a finite sum of
// squares) and finite weights there is no NaN, and with min|h| = bf16(fp32(min|x| * r)) >= 2^-126 and
// min|h| * min|w| >= 2^-126 (smallest nonzero magnitudes; rounding is monotonic) no h or y is
// subnormal. A row that fails takes the exact integer rounding.
struct Bf16Guard {
  static constexpr bool kActive = true;
  bool weight_ok = false;
  float w_min = 0;
  void weight(const uint16_t* w, int64_t dim, bool offset) {
    Bf16Range r;
    int64_t i = 0;
    for (; i + 32 <= dim; i += 32) r.add(_mm512_loadu_si512(w + i));
    if (i < dim) r.add(_mm512_maskz_loadu_epi16((__mmask32)((1ull << (dim - i)) - 1), w + i));
    weight_ok = !offset && r.all_finite();
    w_min = r.min_nonzero();
  }
  // Per-row state: the minimum of |x| (the bf16 bits without the sign) over the row, zeros included
  // (see min_nonzero). A mask and an unsigned min: no shift, so it competes with nothing for port 0.
  struct Row {
    __m512i min_abs = _mm512_set1_epi16(0x7fff);
    void add(__m512i raw) { min_abs = _mm512_min_epu16(min_abs, _mm512_and_si512(raw, _mm512_set1_epi16(0x7fff))); }
    void track32(const uint16_t* x) { add(_mm512_loadu_si512(x)); }
    void track(const uint16_t* x) { track32(x), track32(x + 32); }  // a group of 64
    void track_partial(const uint16_t* x, int64_t n) {  // n <= 32; missing lanes read as zero (skipped)
      add(_mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << n) - 1), x));
    }
    // Smallest nonzero |x| of the row. The cheap minimum counts zeros; only a row holding a zero is
    // scanned again (it is in L1) with zeros skipped.
    float min_nonzero(const uint16_t* x, int64_t dim) const {
      const uint16_t m = Bf16Range::reduce_min(min_abs);
      if (m != 0) return bf16_to_f32(m);
      Bf16Range r;
      int64_t i = 0;
      for (; i + 32 <= dim; i += 32) r.add(_mm512_loadu_si512(x + i));
      if (i < dim) r.add(_mm512_maskz_loadu_epi16((__mmask32)((1ull << (dim - i)) - 1), x + i));
      return r.min_nonzero();
    }
  };
  // In hf mode the smallest nonzero h must be normal already in fp32, not only after rounding to
  // bf16: the hardware conversion reads a subnormal input as zero, so an h just below 2^-126 that
  // rounds up to 2^-126 would come out 0 (tested).
  bool fast(float sum, float rinv, float xmin, bool hf) const {
    if (!weight_ok || !(sum <= 3.4e38f) || !(rinv <= 3.4e38f)) return false;
    if (xmin == 0.0f || w_min == 0.0f) return true;  // all-zero x or w: products are exact zeros
    constexpr double kMinNormal = 0x1p-126;
    float h = static_cast<float>(static_cast<double>(xmin) * rinv);
    if (hf) {
      if (h < kMinNormal) return false;
      h = bf16_to_f32(f32_to_bf16(h));
    }
    return static_cast<double>(h) * w_min >= kMinNormal;
  }
};

}  // namespace
}  // namespace opgym
