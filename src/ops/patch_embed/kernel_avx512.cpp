// patch_embed kernels on the AVX-512 path: kernel_impl.hpp over one zmm per 16 lanes (fma_chain, and the bf16
// forms emulated under MXCSR DAZ+FTZ), and dot_pairs on the CPU's own VDPBF16PS (AVX512-BF16; the front calls
// patch_embed_rows_dpbf16 only where the CPU has it).
#include <immintrin.h>

#include <cstring>

#include "ops/patch_embed/kernel_impl.hpp"

namespace opgym::detail {
namespace {
struct V {
  using T = __m512;
  struct Flush {
    unsigned saved;
    explicit Flush(bool on) : saved(_mm_getcsr()) { _mm_setcsr(on ? (saved | 0x8040u) : (saved & ~0x8040u)); }
    ~Flush() { _mm_setcsr(saved); }
  };
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T t) { _mm512_storeu_ps(p, t); }
  static T bcast(float x) { return _mm512_set1_ps(x); }
  template <bool> static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  template <bool> static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  template <bool> static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static void pair(const uint16_t* p, T& even, T& odd) {
    const __m512i v = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

// dot_pairs with VDPBF16PS: per pair q, c += x[2q+1]*w[2q+1] then c += x[2q]*w[2q] (DAZ, FTZ, RNE: the
// instruction's own). xs: bf16 [32][NPOS][ICP]; w: bf16 [2*b+h][NPOS][ICP/2][16][2].
template <int RB, int PT>
void dp_rows(const PatchEmbedJob& j, const uint16_t* xs, int nr, int64_t b, float* acc) {
  const int64_t npos = j.NPOS;
  const int pairs = PT ? PT : static_cast<int>(j.ICP / 2);
  const int64_t half = npos * pairs * 32, xr = npos * 2 * pairs;
  const uint16_t* w0 = static_cast<const uint16_t*>(j.w) + 2 * b * half;
  for (int r0 = 0; r0 < nr; r0 += RB) {
    __m512 c[RB][2];
    for (int r = 0; r < RB; ++r) c[r][0] = c[r][1] = _mm512_setzero_ps();
    const uint16_t* xb = xs + r0 * xr;
    for (int64_t p = 0; p < npos; ++p) {
      for (int q = 0; q < pairs; ++q) {
        const int64_t k = (p * pairs + q) * 32;
        const __m512i a0 = _mm512_loadu_si512(w0 + k), a1 = _mm512_loadu_si512(w0 + half + k);
        for (int r = 0; r < RB; ++r) {
          uint32_t xp;
          std::memcpy(&xp, xb + r * xr + (p * pairs + q) * 2, 4);
          const __m512i xv = _mm512_set1_epi32(static_cast<int>(xp));
          c[r][0] = _mm512_dpbf16_ps(c[r][0], (__m512bh)xv, (__m512bh)a0);
          c[r][1] = _mm512_dpbf16_ps(c[r][1], (__m512bh)xv, (__m512bh)a1);
        }
      }
    }
    for (int r = 0; r < RB; ++r) {
      _mm512_storeu_ps(acc + (r0 + r) * kPeOcBlock, c[r][0]);
      _mm512_storeu_ps(acc + (r0 + r) * kPeOcBlock + 16, c[r][1]);
    }
  }
}
}  // namespace

void patch_embed_rows_avx512(const PatchEmbedJob& job, const float* xs, int nr, int64_t b0, int64_t b1, float* acc,
                             PeSink sink) {
  pe_rows_any<V, 8>(job, xs, nr, b0, b1, acc, sink);
}

void patch_embed_rows_dpbf16(const PatchEmbedJob& job, const uint16_t* xs, int nr, int64_t b0, int64_t b1,
                             float* acc, PeSink sink) {
  for (int64_t b = b0; b < b1; ++b) {
    if (job.ICP == 4) dp_rows<8, 2>(job, xs, nr, b, acc);
    else dp_rows<8, 0>(job, xs, nr, b, acc);
    sink(b, acc);
  }
}
}  // namespace opgym::detail
