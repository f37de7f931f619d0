// swiglu rows on the avx512 path: kernel_impl.hpp with this path's Simd group, an fma, and Sleef's AVX-512
// u10 expf and tanhf (what torch's Vectorized<float>::exp / tanh call on an AVX-512 build).
#if OPGYM_HAVE_SLEEF
#include <sleef.h>
#endif
#include <algorithm>
#include <cmath>

#include "core/simd_avx512.hpp"
#include "ops/swiglu/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct Exp {
  static constexpr bool kFma = true;  // torch's AVX512 build contracts gelu's kappa * x3 + x (measured)
  static Simd::G madd(const Simd::G& a, const Simd::G& b, const Simd::G& c) {
    Simd::G r;
    for (int k = 0; k < Simd::kRegs; ++k) r.v[k] = _mm512_fmadd_ps(a.v[k], b.v[k], c.v[k]);
    return r;
  }
  static Simd::G tanh(const Simd::G& x) {
    Simd::G r;
#if OPGYM_HAVE_SLEEF
    for (int k = 0; k < Simd::kRegs; ++k) r.v[k] = Sleef_tanhf16_u10avx512f(x.v[k]);
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
    for (int k = 0; k < Simd::kRegs; ++k) r.v[k] = Sleef_expf16_u10avx512f(x.v[k]);
#else  // built without Sleef: glibc's expf per lane (see CMakeLists.txt)
    alignas(64) float f[Simd::kGroup];
    Simd::store_raw(f, x);
    for (float& v : f) v = std::exp(v);
    r = Simd::load_raw(f);
#endif
    return r;
  }
  // The rounded silu of 64 16-bit gate values from the table: a 16-lane gather of 4 bytes at
  // table + 2 * bits (the entry in the low half).
  template <class T>
  static Simd::G lookup(const uint16_t* table, const typename T::storage* p, int64_t n) {
    Simd::G g;
    for (int k = 0; k < Simd::kRegs; ++k) {
      const __m256i h = n == Simd::kGroup ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k))
                                          : _mm256_maskz_loadu_epi16(Simd::mask16(n, k), p + 16 * k);
      const __m512i v = _mm512_i32gather_epi32(_mm512_cvtepu16_epi32(h), table, 2);
      if constexpr (T::dtype == DType::bfloat16) g.v[k] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      else g.v[k] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
    }
    return g;
  }
};
}  // namespace
void swiglu_rows_avx512(const SwigluJob& job, int64_t begin, int64_t end) { swiglu_rows_any<Simd, Exp>(job, begin, end); }

void gelu_tanh_f32_avx512(const float* in, float* out, int64_t n) {
  alignas(64) float buf[Simd::kGroup];
  for (int64_t i = 0; i < n; i += Simd::kGroup) {
    const int64_t m = std::min<int64_t>(Simd::kGroup, n - i);
    for (int64_t k = 0; k < Simd::kGroup; ++k) buf[k] = k < m ? in[i + k] : 0.0f;
    Simd::store_raw(buf, gelu_tanh_group<Simd, Exp>(Simd::load_raw(buf)));
    for (int64_t k = 0; k < m; ++k) out[i + k] = buf[k];
  }
}
}  // namespace opgym::detail
