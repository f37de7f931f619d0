// RMSNorm rows on the AVX-512 path: kernel_impl.hpp compiled with the AVX-512 groups, plus the
// even/odd bf16 layout (SimdBf16) for kernels whose tensors are all bf16.
#define OPGYM_SIMD_BF16 1
#include "core/simd_avx512.hpp"
#include "ops/rms_norm/kernel_impl.hpp"

namespace opgym::detail {
void rms_norm_rows_avx512(const RmsNormJob& job, int64_t begin, int64_t end) { rows_any(job, begin, end); }
void round_f32_avx512(DType to, const float* in, void* out, int64_t n) { round_f32_any(to, in, out, n); }

template <class S> void split_store_and_round_trip(const Simd::G& g, uint16_t* stored, Simd::G& r) {
  S::template store<BF16>(stored, g);
  r = S::template round_trip<BF16>(g);
}

void round_bf16_avx512_split(int variant, const float* in, uint16_t* stored, float* round_tripped, int64_t n) {
  alignas(64) float lanes[64];
  for (int64_t i = 0; i + 64 <= n; i += 64) {
    for (int h = 0; h < 2; ++h)  // the split layout: even elements, then odd, per 32
      for (int j = 0; j < 16; ++j) {
        lanes[32 * h + j] = in[i + 32 * h + 2 * j];
        lanes[32 * h + 16 + j] = in[i + 32 * h + 2 * j + 1];
      }
    Simd::G g;
    for (int k = 0; k < 4; ++k) g.v[k] = _mm512_load_ps(lanes + 16 * k);
    Simd::G r;
    if (variant == 2) split_store_and_round_trip<SimdBf16<true, true>>(g, stored + i, r);
    else if (variant == 1) split_store_and_round_trip<SimdBf16<true>>(g, stored + i, r);
    else split_store_and_round_trip<SimdBf16<false>>(g, stored + i, r);
    for (int k = 0; k < 4; ++k) _mm512_store_ps(lanes + 16 * k, r.v[k]);
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 16; ++j) {
        round_tripped[i + 32 * h + 2 * j] = lanes[32 * h + j];
        round_tripped[i + 32 * h + 2 * j + 1] = lanes[32 * h + 16 + j];
      }
  }
}
}  // namespace opgym::detail
