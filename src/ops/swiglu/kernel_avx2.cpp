// swiglu rows on the avx2 path: kernel_impl.hpp with this path's Simd group, an fma, and Sleef's AVX2 u10
// expf and tanhf (what torch's Vectorized<float>::exp / tanh call on an AVX2 build).
#if OPGYM_HAVE_SLEEF
#include <sleef.h>
#endif
#include <algorithm>
#include <cmath>

#include "core/simd_avx2.hpp"
#include "ops/swiglu/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct Exp {
  static constexpr bool kFma = true;  // torch's AVX2 build contracts gelu's kappa * x3 + x (measured)
  static Simd::G madd(const Simd::G& a, const Simd::G& b, const Simd::G& c) {
    Simd::G r;
    for (int k = 0; k < Simd::kRegs; ++k) r.v[k] = _mm256_fmadd_ps(a.v[k], b.v[k], c.v[k]);
    return r;
  }
  static Simd::G tanh(const Simd::G& x) {
    Simd::G r;
#if OPGYM_HAVE_SLEEF
    for (int k = 0; k < Simd::kRegs; ++k) r.v[k] = Sleef_tanhf8_u10avx2(x.v[k]);
#else  // built without Sleef: glibc's tanhf per lane
    alignas(64) float f[Simd::kGroup];
    Simd::store_raw(f, x);
    for (float& v : f) v = std::tanh(v);
    r = Simd::load_raw(f);
#endif
    return r;
  }
  static Simd::G exp(const Simd::G& x) {
    Simd::G r;
#if OPGYM_HAVE_SLEEF
    for (int k = 0; k < Simd::kRegs; ++k) r.v[k] = Sleef_expf8_u10avx2(x.v[k]);
#else  // built without Sleef: glibc's expf per lane (see CMakeLists.txt)
    alignas(64) float f[Simd::kGroup];
    Simd::store_raw(f, x);
    for (float& v : f) v = std::exp(v);
    r = Simd::load_raw(f);
#endif
    return r;
  }
  // The rounded silu of 64 16-bit gate values from the table: 8-lane gathers of 4 bytes at
  // table + 2 * bits (the entry in the low half); a partial group goes through a zero-padded copy.
  template <class T>
  static Simd::G lookup(const uint16_t* table, const typename T::storage* p, int64_t n) {
    alignas(32) uint16_t pad[Simd::kGroup];
    if (n < Simd::kGroup) {
      for (int i = 0; i < Simd::kGroup; ++i) pad[i] = i < n ? p[i] : 0;
      p = pad;
    }
    Simd::G g;
    for (int k = 0; k < Simd::kRegs; ++k) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * k));
      const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(table), _mm256_cvtepu16_epi32(h), 2);
      if constexpr (T::dtype == DType::bfloat16) {
        g.v[k] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      } else {
        const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, lo), 0x08);  // lanes 0, 2
        g.v[k] = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
      }
    }
    return g;
  }
};
}  // namespace
void swiglu_rows_avx2(const SwigluJob& job, int64_t begin, int64_t end) { swiglu_rows_any<Simd, Exp>(job, begin, end); }

void gelu_tanh_f32_avx2(const float* in, float* out, int64_t n) {
  alignas(64) float buf[Simd::kGroup];
  for (int64_t i = 0; i < n; i += Simd::kGroup) {
    const int64_t m = std::min<int64_t>(Simd::kGroup, n - i);
    for (int64_t k = 0; k < Simd::kGroup; ++k) buf[k] = k < m ? in[i + k] : 0.0f;
    Simd::store_raw(buf, gelu_tanh_group<Simd, Exp>(Simd::load_raw(buf)));
    for (int64_t k = 0; k < m; ++k) out[i + k] = buf[k];
  }
}
}  // namespace opgym::detail
