// patch_embed's fp32-scratch kernels on the AVX2 path: kernel_impl.hpp over two 8-lane ymm registers per 16
// lanes, FMA3; DAZ/FTZ through MXCSR for the emulated bf16 forms.
#include <immintrin.h>

#include "ops/patch_embed/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct V {
  struct T { __m256 a, b; };
  struct Flush {
    unsigned saved;
    explicit Flush(bool on) : saved(_mm_getcsr()) { _mm_setcsr(on ? (saved | 0x8040u) : (saved & ~0x8040u)); }
    ~Flush() { _mm_setcsr(saved); }
  };
  static T zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static T load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store(float* p, const T& t) { _mm256_storeu_ps(p, t.a), _mm256_storeu_ps(p + 8, t.b); }
  static T bcast(float x) { const __m256 v = _mm256_set1_ps(x); return {v, v}; }
  template <bool> static T fma(const T& a, const T& b, const T& c) {
    return {_mm256_fmadd_ps(a.a, b.a, c.a), _mm256_fmadd_ps(a.b, b.b, c.b)};
  }
  template <bool> static T mul(const T& a, const T& b) { return {_mm256_mul_ps(a.a, b.a), _mm256_mul_ps(a.b, b.b)}; }
  template <bool> static T add(const T& a, const T& b) { return {_mm256_add_ps(a.a, b.a), _mm256_add_ps(a.b, b.b)}; }
  static void pair(const uint16_t* p, T& even, T& odd) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    even = {_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
    odd = {_mm256_castsi256_ps(_mm256_and_si256(lo, mask)), _mm256_castsi256_ps(_mm256_and_si256(hi, mask))};
  }
};
}  // namespace

void patch_embed_rows_avx2(const PatchEmbedJob& job, const float* xs, int nr, int64_t b0, int64_t b1, float* acc,
                           PeSink sink) {
  pe_rows_any<V, 2>(job, xs, nr, b0, b1, acc, sink);
}
}  // namespace opgym::detail
