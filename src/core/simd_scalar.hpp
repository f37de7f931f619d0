// Portable "group of 64 floats": the scalar path. Lane j of a group is element j of a 64-element
// chunk; see kSumLanes in rms_norm.hpp for why groups are 64 wide on every path.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/convert.hpp"
#include "core/storage.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see convert.hpp

inline void stream_fence() {}  // the scalar path never streams

struct Simd {
  static constexpr int kGroup = 64;
  struct G { float v[kGroup]; };
  static G splat(float s) { G g; for (float& f : g.v) f = s; return g; }
  static G mul(const G& a, const G& b) { G g; for (int i = 0; i < kGroup; ++i) g.v[i] = a.v[i] * b.v[i]; return g; }
  static G add(const G& a, const G& b) { G g; for (int i = 0; i < kGroup; ++i) g.v[i] = a.v[i] + b.v[i]; return g; }
  static G div(const G& a, const G& b) { G g; for (int i = 0; i < kGroup; ++i) g.v[i] = a.v[i] / b.v[i]; return g; }
  static void store_raw(float* p, const G& g) { for (int i = 0; i < kGroup; ++i) p[i] = g.v[i]; }
  static G load_raw(const float* p) { G g; for (int i = 0; i < kGroup; ++i) g.v[i] = p[i]; return g; }
  static float fold(G g) {
    for (int n = kGroup / 2; n >= 1; n /= 2)
      for (int j = 0; j < n; ++j) g.v[j] += g.v[j + n];
    return g.v[0];
  }
  template <class T> static G load(const typename T::storage* p) {
    G g; for (int i = 0; i < kGroup; ++i) g.v[i] = T::to_f32(p[i]); return g;
  }
  template <class T, bool kStream = false> static void store(typename T::storage* p, const G& g) {
    for (int i = 0; i < kGroup; ++i) p[i] = T::from_f32(g.v[i]);
  }
  // The first n (< kGroup) elements of a group (the AVX-512 groups use masked loads and stores).
  template <class T> static G load_n(const typename T::storage* p, int64_t n) { return load_n_padded<Simd, T>(p, n); }
  template <class T> static void store_n(typename T::storage* p, const G& g, int64_t n) { store_n_padded<Simd, T>(p, g, n); }
  template <class T> static G round_trip(const G& g) {
    G r; for (int i = 0; i < kGroup; ++i) r.v[i] = T::to_f32(T::from_f32(g.v[i])); return r;
  }
};

// sums[r] = ((tails[r] + lanes[r][0]) + lanes[r][1]) ... + lanes[r][7]: the end of torch's row sum.
inline void finish_sums(int n, const float* tails, const float (*lanes)[8], float* sums) {
  for (int r = 0; r < n; ++r) {
    float t = tails[r];
    for (int l = 0; l < 8; ++l) t += lanes[r][l];
    sums[r] = t;
  }
}

// Torch's sum order works on "ILP rows" of four 8-float vectors (32 elements, natural order).
struct Row32 {
  float v[32];
  static Row32 zero() { Row32 r; for (float& f : r.v) f = 0.0f; return r; }
  static Row32 add(const Row32& a, const Row32& b) { Row32 r; for (int i = 0; i < 32; ++i) r.v[i] = a.v[i] + b.v[i]; return r; }
  // acc + x^2 for one ILP row. The portable path assumes no FMA: it always rounds twice, which is
  // what the fused form of the vector paths gives anyway wherever they use it (exact squares).
  template <class T, bool /*kFused*/> static Row32 add_squares(const Row32& acc, const typename T::storage* p) {
    Row32 r; for (int i = 0; i < 32; ++i) { const float x = T::to_f32(p[i]); r.v[i] = acc.v[i] + x * x; } return r;
  }
  // out[l] = ((vector 0 + vector 1) + vector 2) + vector 3, lane l: torch's combination of its four
  // ILP accumulators.
  // With `extra` (0..3) leftover whole vectors at p: their squares go into vector 0 first, in order.
  template <class T> static void lanes8(float* out, const Row32& r, const typename T::storage* p = nullptr, int64_t extra = 0) {
    for (int l = 0; l < 8; ++l) {
      float v0 = r.v[l];
      for (int64_t e = 0; e < extra; ++e) {
        const float x = T::to_f32(p[8 * e + l]);
        v0 += x * x;
      }
      out[l] = ((v0 + r.v[8 + l]) + r.v[16 + l]) + r.v[24 + l];
    }
  }
};

}  // namespace
}  // namespace opgym
