// attn_softmax rows on the avx512 path: kernel_impl.hpp with torch's AVX512 build's softmax pieces:
// Vectorized<float> of 16 lanes, Sleef's expf16_u10 (Vectorized<float>::exp), vec::maximum (max, NaN if
// either is), and vec_reduce_all's tree for the sum (lanes i and i^8, then i^4, i^2, i^1).
#if OPGYM_HAVE_SLEEF
#include <sleef.h>
#endif
#include <cmath>

#include "core/simd_avx512.hpp"
#include "ops/attn_softmax/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct K {
  static constexpr int kLanes = 16;
  using Acc = __m512;
  static __m512 max1(__m512 a, __m512 b) {
    const __mmask16 nan = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    return _mm512_or_ps(_mm512_max_ps(a, b), _mm512_castsi512_ps(_mm512_maskz_set1_epi32(nan, -1)));
  }
  static Simd::G max(const Simd::G& a, const Simd::G& b) {
    Simd::G r;
    for (int k = 0; k < Simd::kRegs; ++k) r.v[k] = max1(a.v[k], b.v[k]);
    return r;
  }
  static float hmax(const Simd::G& g) {
    __m512 v = max1(max1(g.v[0], g.v[1]), max1(g.v[2], g.v[3]));
    v = max1(v, _mm512_shuffle_f32x4(v, v, 0x4E));
    v = max1(v, _mm512_shuffle_f32x4(v, v, 0xB1));
    v = max1(v, _mm512_shuffle_ps(v, v, 0x4E));
    v = max1(v, _mm512_shuffle_ps(v, v, 0xB1));
    return _mm512_cvtss_f32(v);
  }
  static Simd::G exp_shifted(const Simd::G& x, float max) {
    const __m512 m = _mm512_set1_ps(max);
    Simd::G r;
    for (int k = 0; k < Simd::kRegs; ++k) {
      const __m512 d = _mm512_sub_ps(x.v[k], m);
#if OPGYM_HAVE_SLEEF
      r.v[k] = Sleef_expf16_u10avx512f(d);
#else  // built without Sleef: glibc's expf per lane (see CMakeLists.txt)
      alignas(64) float f[16];
      _mm512_store_ps(f, d);
      for (float& v : f) v = std::exp(v);
      r.v[k] = _mm512_load_ps(f);
#endif
    }
    return r;
  }
  // One group's torch vectors into the sum, in order; `first`: the row's first group (its first vector
  // starts the accumulator; the row has >= 16 elements here). A partial vector adds into its first lanes.
  static void accumulate(Acc& acc, const Simd::G& e, int64_t nn, bool first) {
    for (int k = 0; k < Simd::kRegs; ++k) {
      const int64_t c = nn - 16 * k;
      if (c <= 0) break;
      if (first && k == 0) acc = e.v[0];
      else if (c >= 16) acc = _mm512_add_ps(acc, e.v[k]);
      else acc = _mm512_mask_add_ps(acc, static_cast<__mmask16>((1u << c) - 1), acc, e.v[k]);
    }
  }
  static float total(__m512 v) {
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
    v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0x4E));
    v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0xB1));
    return _mm512_cvtss_f32(v);
  }
};
}  // namespace
void attn_softmax_rows_avx512(const AttnSoftmaxJob& job, int64_t begin, int64_t end, float* scratch) {
  attn_softmax_rows_any<Simd, K>(job, begin, end, scratch);
}
void attn_softmax_exp_avx512(const float* x, float* y, int64_t n) { attn_softmax_exp_any<Simd, K>(x, y, n); }
}  // namespace opgym::detail
