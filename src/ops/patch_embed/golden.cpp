// patch_embed's golden: each form's arithmetic as include/opgym/patch_embed.hpp states it, one output at a time
// from the unpacked weight [OC, K] (k = ic * positions + pos), single-threaded, DAZ/FTZ written out (no MXCSR).
#include <cmath>

#include "core/storage.hpp"
#include "opgym/patch_embed.hpp"
#include "ops/patch_embed/kernel.hpp"

namespace opgym::reference {

namespace {
float flush(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }
// DAZ on every operand, FTZ on the result: what TDPBF16PS and VDPBF16PS do (measured: the op's README).
float fma_flushed(float a, float b, float c) { return flush(std::fma(flush(a), flush(b), flush(c))); }
float mul_flushed(float a, float b) { return flush(flush(a) * flush(b)); }
float add_flushed(float a, float b) { return flush(flush(a) + flush(b)); }
}  // namespace

void patch_embed_basic_ops(const TensorView& x, const TensorView& weight, int64_t in_channels, const TensorView* bias,
                           const TensorView& out, PatchEmbedForm form) {
  if (!detail::check_patch_embed_unpacked(x, weight, in_channels, bias, out, form)) return;
  const int64_t P = x.shape[0], OC = weight.shape[0], IC = in_channels, NPOS = weight.shape[1] / in_channels;
  const int64_t ICP = form == PatchEmbedForm::fma_chain ? IC : (IC + 1) / 2 * 2;
  const DType dt = x.dtype;
  auto xv = [&](int64_t p, int64_t ic, int64_t pos) {  // pad channels read as +0
    return ic < IC ? load_as_f32(dt, x.data, p * x.strides[0] + ic * NPOS + pos) : 0.0f;
  };
  auto wv = [&](int64_t o, int64_t ic, int64_t pos) {
    return ic < IC ? load_as_f32(dt, weight.data, o * weight.strides[0] + ic * NPOS + pos) : 0.0f;
  };
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t o = 0; o < OC; ++o) {
      float c = 0.0f;
      for (int64_t pos = 0; pos < NPOS; ++pos) {
        switch (form) {
          case PatchEmbedForm::amx_tile: {
            // one TDPBF16PS: even channels' chain, odd channels' chain, each from its first product
            float e = mul_flushed(xv(p, 0, pos), wv(o, 0, pos));
            float od = mul_flushed(xv(p, 1, pos), wv(o, 1, pos));
            for (int64_t q = 1; q < ICP / 2; ++q) {
              e = fma_flushed(xv(p, 2 * q, pos), wv(o, 2 * q, pos), e);
              od = fma_flushed(xv(p, 2 * q + 1, pos), wv(o, 2 * q + 1, pos), od);
            }
            c = add_flushed(c, add_flushed(e, od));
            break;
          }
          case PatchEmbedForm::dot_pairs:
            // one VDPBF16PS per channel pair: the odd channel first
            for (int64_t q = 0; q < ICP / 2; ++q) {
              c = fma_flushed(xv(p, 2 * q + 1, pos), wv(o, 2 * q + 1, pos), c);
              c = fma_flushed(xv(p, 2 * q, pos), wv(o, 2 * q, pos), c);
            }
            break;
          case PatchEmbedForm::fma_chain:
            for (int64_t ic = 0; ic < IC; ++ic) c = std::fma(xv(p, ic, pos), wv(o, ic, pos), c);
            break;
        }
      }
      if (bias) c = c + load_as_f32(dt, bias->data, o * bias->strides[0]);
      const int64_t off = p * out.strides[0] + o;
      if (dt == DType::bfloat16 && form != PatchEmbedForm::fma_chain && std::fpclassify(c) == FP_SUBNORMAL)
        store_from_f32(dt, out.data, off, std::copysign(0.0f, c));  // VCVTNEPS2BF16: denormal in, zero out
      else
        store_from_f32(dt, out.data, off, c);
    }
  }
}

}  // namespace opgym::reference
