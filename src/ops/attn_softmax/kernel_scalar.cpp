// attn_softmax rows on the scalar path: kernel_impl.hpp with torch's DEFAULT build's softmax pieces (a CPU
// without AVX2, or ATEN_CPU_CAPABILITY=default): the generic Vectorized<float> of 8 lanes, std::exp (glibc's
// expf) on each, its maximum (a > b ? a : b, NaN if a is), and vec_reduce_all's generic fold of the 8 lanes
// in order for the sum.
#include <cmath>

#include "core/simd_scalar.hpp"
#include "ops/attn_softmax/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct K {
  static constexpr int kLanes = 8;
  struct Acc { float v[8]; };
  static float max1(float a, float b) { return std::isnan(a) ? a : (a > b ? a : b); }
  static Simd::G max(const Simd::G& a, const Simd::G& b) {
    Simd::G r;
    for (int i = 0; i < Simd::kGroup; ++i) r.v[i] = max1(a.v[i], b.v[i]);
    return r;
  }
  static float hmax(const Simd::G& g) {
    float m = g.v[0];
    for (int i = 1; i < Simd::kGroup; ++i) m = max1(m, g.v[i]);
    return m;
  }
  static Simd::G exp_shifted(const Simd::G& x, float max) {
    Simd::G r;
    for (int i = 0; i < Simd::kGroup; ++i) r.v[i] = std::exp(x.v[i] - max);
    return r;
  }
  static void accumulate(Acc& acc, const Simd::G& e, int64_t nn, bool first) {
    for (int k = 0; k < Simd::kGroup / 8; ++k) {
      const int64_t c = std::min<int64_t>(nn - 8 * k, 8);
      if (c <= 0) break;
      for (int l = 0; l < c; ++l) acc.v[l] = first && k == 0 ? e.v[l] : acc.v[l] + e.v[8 * k + l];
    }
  }
  static float total(const Acc& a) {
    float s = a.v[0];
    for (int l = 1; l < 8; ++l) s += a.v[l];
    return s;
  }
};
}  // namespace
void attn_softmax_rows_scalar(const AttnSoftmaxJob& job, int64_t begin, int64_t end, float* scratch) {
  attn_softmax_rows_any<Simd, K>(job, begin, end, scratch);
}
void attn_softmax_exp_scalar(const float* x, float* y, int64_t n) { attn_softmax_exp_any<Simd, K>(x, y, n); }
}  // namespace opgym::detail
