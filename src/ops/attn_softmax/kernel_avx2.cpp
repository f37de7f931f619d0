// attn_softmax rows on the avx2 path: kernel_impl.hpp with torch's AVX2 build's softmax pieces:
// Vectorized<float> of 8 lanes, Sleef's expf8_u10 (Vectorized<float>::exp), vec::maximum (max, NaN if
// either is), and vec_reduce_all's tree for the sum (lanes i and i^4, then i^2, i^1).
#if OPGYM_HAVE_SLEEF
#include <sleef.h>
#endif
#include <cmath>

#include "core/simd_avx2.hpp"
#include "ops/attn_softmax/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct K {
  static constexpr int kLanes = 8;
  using Acc = __m256;
  static __m256 max1(__m256 a, __m256 b) {
    return _mm256_or_ps(_mm256_max_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  static Simd::G max(const Simd::G& a, const Simd::G& b) {
    Simd::G r;
    for (int k = 0; k < Simd::kRegs; ++k) r.v[k] = max1(a.v[k], b.v[k]);
    return r;
  }
  static float hmax(const Simd::G& g) {
    __m256 q[4];
    for (int k = 0; k < 4; ++k) q[k] = max1(g.v[k], g.v[k + 4]);
    __m256 v = max1(max1(q[0], q[1]), max1(q[2], q[3]));
    v = max1(v, _mm256_permute2f128_ps(v, v, 1));
    v = max1(v, _mm256_shuffle_ps(v, v, 0x4E));
    v = max1(v, _mm256_shuffle_ps(v, v, 0xB1));
    return _mm256_cvtss_f32(v);
  }
  static Simd::G exp_shifted(const Simd::G& x, float max) {
    const __m256 m = _mm256_set1_ps(max);
    Simd::G r;
    for (int k = 0; k < Simd::kRegs; ++k) {
      const __m256 d = _mm256_sub_ps(x.v[k], m);
#if OPGYM_HAVE_SLEEF
      r.v[k] = Sleef_expf8_u10avx2(d);
#else  // built without Sleef: glibc's expf per lane (see CMakeLists.txt)
      alignas(32) float f[8];
      _mm256_store_ps(f, d);
      for (float& v : f) v = std::exp(v);
      r.v[k] = _mm256_load_ps(f);
#endif
    }
    return r;
  }
  // As the AVX-512 helper's, with 8-lane vectors (a partial one through a lane blend).
  static void accumulate(Acc& acc, const Simd::G& e, int64_t nn, bool first) {
    for (int k = 0; k < Simd::kRegs; ++k) {
      const int64_t c = nn - 8 * k;
      if (c <= 0) break;
      if (first && k == 0) {
        acc = e.v[0];
      } else if (c >= 8) {
        acc = _mm256_add_ps(acc, e.v[k]);
      } else {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(c)), lane));
        acc = _mm256_blendv_ps(acc, _mm256_add_ps(acc, e.v[k]), in);
      }
    }
  }
  static float total(__m256 v) {
    v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0x4E));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0xB1));
    return _mm256_cvtss_f32(v);
  }
};
}  // namespace
void attn_softmax_rows_avx2(const AttnSoftmaxJob& job, int64_t begin, int64_t end, float* scratch) {
  attn_softmax_rows_any<Simd, K>(job, begin, end, scratch);
}
void attn_softmax_exp_avx2(const float* x, float* y, int64_t n) { attn_softmax_exp_any<Simd, K>(x, y, n); }
}  // namespace opgym::detail
