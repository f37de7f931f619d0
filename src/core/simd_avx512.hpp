// AVX-512 (F, BW, VL, DQ) "group of 32 floats" = two zmm registers (lanes 0-15, 16-31).
// bf16 rounding is done with integer ops, not AVX512-BF16's VCVTNEPS2BF16: that instruction
// flushes subnormal inputs to zero, and torch keeps them, so it would break bit-exactness.
// Compiled only in translation units built with the AVX-512 flags.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "core/storage.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see convert.hpp

struct Simd {
  struct G { __m512 v[2]; };
  static G splat(float s) { const __m512 x = _mm512_set1_ps(s); return {{x, x}}; }
  static G mul(const G& a, const G& b) { return {{_mm512_mul_ps(a.v[0], b.v[0]), _mm512_mul_ps(a.v[1], b.v[1])}}; }
  static G add(const G& a, const G& b) { return {{_mm512_add_ps(a.v[0], b.v[0]), _mm512_add_ps(a.v[1], b.v[1])}}; }
  // Fold by halves, exactly as the scalar path.
  static float fold(const G& g) {
    const __m512 h16 = _mm512_add_ps(g.v[0], g.v[1]);
    const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(h16),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(h16), 1)));
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    const __m128 h1 = _mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1));
    return _mm_cvtss_f32(h1);
  }

  static __m512i f32_to_bf16_u32(__m512 f) {  // RNE, NaN -> 0x7fc0; 16 x uint32
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    return _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7fc0));
  }

  template <class T> static G load(const typename T::storage* p) {
    G g;
    for (int k = 0; k < 2; ++k) {
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
  template <class T> static void store(typename T::storage* p, const G& g) {
    for (int k = 0; k < 2; ++k) {
      if constexpr (T::dtype == DType::float32) {
        _mm512_storeu_ps(p + 16 * k, g.v[k]);
      } else {
        __m256i h;
        if constexpr (T::dtype == DType::float16) h = _mm512_cvtps_ph(g.v[k], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        else h = _mm512_cvtepi32_epi16(f32_to_bf16_u32(g.v[k]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 16 * k), h);
      }
    }
  }
  template <class T> static G round_trip(const G& g) {
    if constexpr (T::dtype == DType::float32) {
      return g;
    } else {
      G r;
      for (int k = 0; k < 2; ++k) {
        if constexpr (T::dtype == DType::float16)
          r.v[k] = _mm512_cvtph_ps(_mm512_cvtps_ph(g.v[k], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        else
          r.v[k] = _mm512_castsi512_ps(_mm512_slli_epi32(f32_to_bf16_u32(g.v[k]), 16));
      }
      return r;
    }
  }
};

}  // namespace
}  // namespace opgym
