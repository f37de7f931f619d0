// swiglu rows on the avx2 path: kernel_impl.hpp with this path's Simd group and Sleef's AVX2 u10
// expf (what torch's Vectorized<float>::exp calls on an AVX2 build).
#if OPGYM_HAVE_SLEEF
#include <sleef.h>
#endif
#include <cmath>

#include "core/simd_avx2.hpp"
#include "ops/swiglu/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct Exp {
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
}  // namespace opgym::detail
