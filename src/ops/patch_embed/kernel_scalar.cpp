// patch_embed's fp32-scratch kernels on the scalar path (any CPU): kernel_impl.hpp over 16 plain floats. No
// MXCSR here: DAZ and FTZ are explicit (F = true), so the path is portable and gives the vector paths' bits.
#include <cmath>

#include "ops/patch_embed/kernel_impl.hpp"

namespace opgym::detail {
namespace {
inline float flush(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

struct V {
  struct T { float v[16]; };
  struct Flush { explicit Flush(bool) {} };
  static T zero() { return T{}; }
  static T load(const float* p) { T t; for (int i = 0; i < 16; ++i) t.v[i] = p[i]; return t; }
  static void store(float* p, const T& t) { for (int i = 0; i < 16; ++i) p[i] = t.v[i]; }
  static T bcast(float x) { T t; for (float& v : t.v) v = x; return t; }
  template <bool F> static T fma(const T& a, const T& b, const T& c) {
    T t;
    for (int i = 0; i < 16; ++i)
      t.v[i] = F ? flush(std::fma(flush(a.v[i]), flush(b.v[i]), flush(c.v[i]))) : std::fma(a.v[i], b.v[i], c.v[i]);
    return t;
  }
  template <bool F> static T mul(const T& a, const T& b) {
    T t;
    for (int i = 0; i < 16; ++i) t.v[i] = F ? flush(flush(a.v[i]) * flush(b.v[i])) : a.v[i] * b.v[i];
    return t;
  }
  template <bool F> static T add(const T& a, const T& b) {
    T t;
    for (int i = 0; i < 16; ++i) t.v[i] = F ? flush(flush(a.v[i]) + flush(b.v[i])) : a.v[i] + b.v[i];
    return t;
  }
  static void pair(const uint16_t* p, T& even, T& odd) {
    for (int i = 0; i < 16; ++i) even.v[i] = bf16_bits(p[2 * i]), odd.v[i] = bf16_bits(p[2 * i + 1]);
  }
  static float bf16_bits(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
};
}  // namespace

void patch_embed_rows_scalar(const PatchEmbedJob& job, const float* xs, int nr, int64_t b0, int64_t b1, float* acc,
                             PeSink sink) {
  pe_rows_any<V, 4>(job, xs, nr, b0, b1, acc, sink);
}

// No AVX512-BF16 / AMX code in this build: the front never calls these on the scalar path (declared for all).
}  // namespace opgym::detail
