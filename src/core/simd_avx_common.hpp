// What the AVX2 and AVX-512 groups share, on 256-bit AVX only: the tail pieces of torch's row sum
// (leftover vectors of a row, the end of the sum for a batch of rows). Included by simd_avx2.hpp and simd_avx512.hpp; like them it has internal linkage, so each
// instruction set's translation unit compiles its own copy with its own flags.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "core/storage.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see convert.hpp

// v0 + x^2 for each of `n` whole 8-element vectors at p, in order (products rounded, then added):
// torch's leftover vectors, added into its first vector.
template <class T> __m256 add_squares8(__m256 v0, const typename T::storage* p, int64_t n) {
  for (int64_t e = 0; e < n; ++e) {
    __m256 x;
    if constexpr (T::dtype == DType::float32) {
      x = _mm256_loadu_ps(p + 8 * e);
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * e));
      if constexpr (T::dtype == DType::float16) x = _mm256_cvtph_ps(h);
      else x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    v0 = _mm256_add_ps(v0, _mm256_mul_ps(x, x));
  }
  return v0;
}

// sums[r] = ((tails[r] + lanes[r][0]) + lanes[r][1]) ... + lanes[r][7]: the end of torch's row sum,
// eight rows at a time: an 8x8 transpose turns eight rows' lanes into eight columns, and eight vector
// adds run the eight chains side by side (the same adds in the same order, per row).
inline void finish_sums(int n, const float* tails, const float (*lanes)[8], float* sums) {
  int r = 0;
  for (; r + 8 <= n; r += 8) {
    __m256 a[8], b[8];
    for (int k = 0; k < 8; ++k) a[k] = _mm256_load_ps(lanes[r + k]);
    for (int k = 0; k < 8; k += 2) {
      b[k] = _mm256_unpacklo_ps(a[k], a[k + 1]);
      b[k + 1] = _mm256_unpackhi_ps(a[k], a[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
      a[k] = _mm256_shuffle_ps(b[k], b[k + 2], 0x44);
      a[k + 1] = _mm256_shuffle_ps(b[k], b[k + 2], 0xee);
      a[k + 2] = _mm256_shuffle_ps(b[k + 1], b[k + 3], 0x44);
      a[k + 3] = _mm256_shuffle_ps(b[k + 1], b[k + 3], 0xee);
    }
    __m256 t = _mm256_loadu_ps(tails + r);
    for (int l = 0; l < 4; ++l) t = _mm256_add_ps(t, _mm256_permute2f128_ps(a[l], a[l + 4], 0x20));
    for (int l = 0; l < 4; ++l) t = _mm256_add_ps(t, _mm256_permute2f128_ps(a[l], a[l + 4], 0x31));
    _mm256_storeu_ps(sums + r, t);
  }
  for (; r < n; ++r) {
    float t = tails[r];
    for (int l = 0; l < 8; ++l) t += lanes[r][l];
    sums[r] = t;
  }
}

}  // namespace
}  // namespace opgym
