// AVX2 + FMA + F16C "group of 64 floats" = eight ymm registers (v[k] holds elements 8k .. 8k+7).
// Compiled only in translation units built with -mavx2 -mfma -mf16c.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "core/simd_avx_common.hpp"
#include "core/storage.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see convert.hpp

inline void stream_fence() { _mm_sfence(); }  // order non-temporal stores before returning

struct Simd {
  static constexpr int kGroup = 64, kRegs = 8;
  struct G { __m256 v[kRegs]; };
  static G splat(float s) { G g; for (auto& r : g.v) r = _mm256_set1_ps(s); return g; }
  static G mul(const G& a, const G& b) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm256_mul_ps(a.v[k], b.v[k]); return g; }
  static G add(const G& a, const G& b) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm256_add_ps(a.v[k], b.v[k]); return g; }
  static G div(const G& a, const G& b) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm256_div_ps(a.v[k], b.v[k]); return g; }
  static void store_raw(float* p, const G& g) { for (int k = 0; k < kRegs; ++k) _mm256_storeu_ps(p + 8 * k, g.v[k]); }
  static G load_raw(const float* p) { G g; for (int k = 0; k < kRegs; ++k) g.v[k] = _mm256_loadu_ps(p + 8 * k); return g; }
  // Fold by halves, exactly as the scalar path: p[j] += p[j+32], += p[j+16], += p[j+8], ...
  static float fold(const G& g) {
    __m256 q[4];
    for (int k = 0; k < 4; ++k) q[k] = _mm256_add_ps(g.v[k], g.v[k + 4]);  // +32
    const __m256 h16 = _mm256_add_ps(q[0], q[2]);       // lanes 0-7  (+16)
    const __m256 l16 = _mm256_add_ps(q[1], q[3]);       // lanes 8-15 (+16)
    const __m256 h8 = _mm256_add_ps(h16, l16);          // j += j+8
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    const __m128 h1 = _mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1));
    return _mm_cvtss_f32(h1);
  }

  // bf16 <-> fp32 on 8 lanes.
  static __m256 bf16x8_to_f32(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // Round to nearest even in the integer domain; NaN -> 0x7fc0. Result: 8 x uint32 (low halves).
  static __m256i f32_to_bf16_u32(__m256 f) {
    const __m256i u = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    r = _mm256_srli_epi32(r, 16);
    const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
  }
  static __m256i pack_u32_pair(__m256i a, __m256i b) {  // 16 x u16 in order a[0..7], b[0..7]
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
  }

  template <class T> static G load(const typename T::storage* p) {
    G g;
    if constexpr (T::dtype == DType::float32) {
      for (int k = 0; k < kRegs; ++k) g.v[k] = _mm256_loadu_ps(p + 8 * k);
    } else if constexpr (T::dtype == DType::float16) {
      for (int k = 0; k < kRegs; ++k)
        g.v[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * k)));
    } else {
      for (int k = 0; k < kRegs; ++k)
        g.v[k] = bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * k)));
    }
    return g;
  }
  // kStream: non-temporal stores (p must be 64-byte aligned), for outputs too large to stay cached.
  template <class T, bool kStream = false> static void store(typename T::storage* p, const G& g) {
    if constexpr (T::dtype == DType::float32) {
      for (int k = 0; k < kRegs; ++k) {
        if constexpr (kStream) _mm256_stream_ps(p + 8 * k, g.v[k]);
        else _mm256_storeu_ps(p + 8 * k, g.v[k]);
      }
    } else if constexpr (T::dtype == DType::float16) {
      for (int k = 0; k < kRegs; ++k) {
        const __m128i h = _mm256_cvtps_ph(g.v[k], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if constexpr (kStream) _mm_stream_si128(reinterpret_cast<__m128i*>(p + 8 * k), h);
        else _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8 * k), h);
      }
    } else {
      for (int k = 0; k < kRegs; k += 2) {
        const __m256i h = pack_u32_pair(f32_to_bf16_u32(g.v[k]), f32_to_bf16_u32(g.v[k + 1]));
        if constexpr (kStream) _mm256_stream_si256(reinterpret_cast<__m256i*>(p + 8 * k), h);
        else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 8 * k), h);
      }
    }
  }
  // The first n (< kGroup) elements of a group (the AVX-512 groups use masked loads and stores).
  template <class T> static G load_n(const typename T::storage* p, int64_t n) { return load_n_padded<Simd, T>(p, n); }
  template <class T> static void store_n(typename T::storage* p, const G& g, int64_t n) { store_n_padded<Simd, T>(p, g, n); }
  template <class T> static G round_trip(const G& g) {
    if constexpr (T::dtype == DType::float32) {
      return g;
    } else if constexpr (T::dtype == DType::float16) {
      G r;
      for (int k = 0; k < kRegs; ++k)
        r.v[k] = _mm256_cvtph_ps(_mm256_cvtps_ph(g.v[k], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      return r;
    } else {
      G r;
      for (int k = 0; k < kRegs; ++k)
        r.v[k] = _mm256_castsi256_ps(_mm256_slli_epi32(f32_to_bf16_u32(g.v[k]), 16));
      return r;
    }
  }
};

// Torch's sum order works on "ILP rows" of four 8-float vectors (32 elements, natural order).
struct Row32 {
  __m256 v[4];
  static Row32 zero() { const __m256 z = _mm256_setzero_ps(); return {{z, z, z, z}}; }
  static Row32 add(const Row32& a, const Row32& b) {
    Row32 r; for (int k = 0; k < 4; ++k) r.v[k] = _mm256_add_ps(a.v[k], b.v[k]); return r;
  }
  // acc + x^2 for one ILP row; kFused: by FMA, where that gives the same bits (see the AVX-512 Row32).
  template <class T, bool kFused> static Row32 add_squares(const Row32& acc, const typename T::storage* p) {
    Row32 r;
    for (int k = 0; k < 4; ++k) {
      __m256 x;
      if constexpr (T::dtype == DType::float32) x = _mm256_loadu_ps(p + 8 * k);
      else if constexpr (T::dtype == DType::float16) x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * k)));
      else x = Simd::bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * k)));
      if constexpr (kFused && T::dtype != DType::float32) r.v[k] = _mm256_fmadd_ps(x, x, acc.v[k]);
      else r.v[k] = _mm256_add_ps(acc.v[k], _mm256_mul_ps(x, x));
    }
    return r;
  }
  // out[l] = ((vector 0 + vector 1) + vector 2) + vector 3, lane l (three vector adds).
  // With `extra` (0..3) leftover whole vectors at p: their squares go into vector 0 first, in order.
  template <class T> static void lanes8(float* out, const Row32& r, const typename T::storage* p = nullptr, int64_t extra = 0) {
    const __m256 v0 = add_squares8<T>(r.v[0], p, extra);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v0, r.v[1]), r.v[2]), r.v[3]));
  }
};

}  // namespace
}  // namespace opgym
