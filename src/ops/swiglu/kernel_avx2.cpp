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
};
}  // namespace
void swiglu_rows_avx2(const SwigluJob& job, int64_t begin, int64_t end) { swiglu_rows_any<Simd, Exp>(job, begin, end); }
}  // namespace opgym::detail
