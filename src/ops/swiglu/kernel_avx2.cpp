// swiglu rows on the avx2 path: kernel_impl.hpp with this path's Simd group and Sleef's AVX2 u10
// expf (what torch's Vectorized<float>::exp calls on an AVX2 build).
#include <sleef.h>

#include "core/simd_avx2.hpp"
#include "ops/swiglu/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct Exp {
  static Simd::G exp(const Simd::G& x) {
    Simd::G r;
    for (int k = 0; k < Simd::kRegs; ++k) r.v[k] = Sleef_expf8_u10avx2(x.v[k]);
    return r;
  }
};
}  // namespace
void swiglu_rows_avx2(const SwigluJob& job, int64_t begin, int64_t end) { swiglu_rows_any<Simd, Exp>(job, begin, end); }
}  // namespace opgym::detail
