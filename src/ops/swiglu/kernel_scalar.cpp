// swiglu rows on the scalar path: kernel_impl.hpp with this path's Simd group and glibc's expf and
// tanhf, no fma, as torch computes silu and gelu on a CPU without AVX2 (its DEFAULT build maps std::exp
// / std::tanh over the lanes and has no FMA to contract with).
#include <cmath>

#include "core/simd_scalar.hpp"
#include "ops/swiglu/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct Exp {
  static constexpr bool kFma = false;  // torch's DEFAULT build: no fma anywhere
  static Simd::G madd(const Simd::G& a, const Simd::G& b, const Simd::G& c) { return Simd::add(Simd::mul(a, b), c); }
  static Simd::G tanh(const Simd::G& x) {
    Simd::G r;
    for (int i = 0; i < Simd::kGroup; ++i) r.v[i] = std::tanh(x.v[i]);
    return r;
  }
  static Simd::G exp(const Simd::G& x) {
    Simd::G r;
    for (int i = 0; i < Simd::kGroup; ++i) r.v[i] = std::exp(x.v[i]);
    return r;
  }
  template <class T>
  static Simd::G lookup(const uint16_t* table, const typename T::storage* p, int64_t n) {
    Simd::G g;
    for (int i = 0; i < Simd::kGroup; ++i) g.v[i] = i < n ? T::to_f32(table[p[i]]) : 0.0f;
    return g;
  }
};
}  // namespace
void swiglu_rows_scalar(const SwigluJob& job, int64_t begin, int64_t end) { swiglu_rows_any<Simd, Exp>(job, begin, end); }
}  // namespace opgym::detail
