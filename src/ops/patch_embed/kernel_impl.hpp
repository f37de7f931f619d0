// The fp32-scratch patch_embed kernels, written once against a 16-lane vector `V` (kernel_{scalar,avx2,avx512}.cpp
// supply it) and compiled per instruction set. Lanes are 16 output channels; each lane's accumulator runs the
// form's sequential chain (include/opgym/patch_embed.hpp), so every ISA gives the same bits by construction.
//
// V provides: T; zero(); load(const float*); store(float*, T); bcast(float); fma<F>(a, b, c) = a*b + c rounded
// once; mul<F>; add<F>; pair(const uint16_t* p, T& even, T& odd) (16 bf16 pairs -> fp32); and `Flush`, a
// scoped guard that puts the thread into DAZ+FTZ (true) or neither (false) for the ISAs whose vector unit
// has the modes (MXCSR); F = true asks V's ops to flush explicitly where it has no such mode (scalar).
#pragma once
#include <cstdint>

#include "ops/patch_embed/kernel.hpp"

namespace opgym::detail {
namespace {  // NOLINT: internal linkage per instruction set (see core/convert.hpp)

// fma_chain: c = fma(x[ic], w[ic], c) over (pos, ic). xs: fp32 [32][NPOS][IC]; w: fp32 [2*b+h][NPOS][IC][16].
template <class V, int RB, int ICT>
void pe_chain(const PatchEmbedJob& j, const float* xs, int nr, int64_t b, float* acc) {
  using T = typename V::T;
  const int64_t npos = j.NPOS;
  const int ic = ICT ? ICT : static_cast<int>(j.IC);
  const int64_t half = npos * ic * 16, xr = npos * ic;
  const float* w0 = static_cast<const float*>(j.w) + 2 * b * half;
  const float* w1 = w0 + half;
  for (int r0 = 0; r0 < nr; r0 += RB) {
    T c[RB][2];
    for (int r = 0; r < RB; ++r) c[r][0] = c[r][1] = V::zero();
    const float* xb = xs + r0 * xr;
    for (int64_t p = 0; p < npos; ++p) {
      for (int i = 0; i < ic; ++i) {
        const int64_t k = p * ic + i;
        const T a0 = V::load(w0 + k * 16), a1 = V::load(w1 + k * 16);
        for (int r = 0; r < RB; ++r) {
          const T xv = V::bcast(xb[r * xr + k]);
          c[r][0] = V::template fma<false>(xv, a0, c[r][0]);
          c[r][1] = V::template fma<false>(xv, a1, c[r][1]);
        }
      }
    }
    for (int r = 0; r < RB; ++r) {
      V::store(acc + (r0 + r) * kPeOcBlock, c[r][0]);
      V::store(acc + (r0 + r) * kPeOcBlock + 16, c[r][1]);
    }
  }
}

// amx_tile (emulated) and dot_pairs (emulated). xs: fp32 [32][NPOS][ICP] (pad channels 0); w: bf16
// [2*b+h][NPOS][ICP/2][16][2]. Both flush (DAZ/FTZ) on every operation, as the instructions do.
template <class V, int RB, int PT, bool Amx>
void pe_bf16(const PatchEmbedJob& j, const float* xs, int nr, int64_t b, float* acc) {
  using T = typename V::T;
  const int64_t npos = j.NPOS;
  const int pairs = PT ? PT : static_cast<int>(j.ICP / 2);
  const int icp = 2 * pairs;
  const int64_t half = npos * pairs * 32, xr = npos * icp;
  const uint16_t* w0 = static_cast<const uint16_t*>(j.w) + 2 * b * half;
  for (int r0 = 0; r0 < nr; r0 += RB) {
    T c[RB][2];
    for (int r = 0; r < RB; ++r) c[r][0] = c[r][1] = V::zero();
    const float* xb = xs + r0 * xr;
    for (int64_t p = 0; p < npos; ++p) {
      for (int h = 0; h < 2; ++h) {
        const uint16_t* wp = w0 + h * half + p * pairs * 32;
        for (int r = 0; r < RB; ++r) {
          const float* xp = xb + r * xr + p * icp;
          if constexpr (Amx) {
            T we, wo;
            V::pair(wp, we, wo);
            T e = V::template mul<true>(V::bcast(xp[0]), we);
            T o = V::template mul<true>(V::bcast(xp[1]), wo);
            for (int q = 1; q < pairs; ++q) {
              V::pair(wp + q * 32, we, wo);
              e = V::template fma<true>(V::bcast(xp[2 * q]), we, e);
              o = V::template fma<true>(V::bcast(xp[2 * q + 1]), wo, o);
            }
            c[r][h] = V::template add<true>(c[r][h], V::template add<true>(e, o));
          } else {
            T cc = c[r][h];
            for (int q = 0; q < pairs; ++q) {
              T we, wo;
              V::pair(wp + q * 32, we, wo);
              cc = V::template fma<true>(V::bcast(xp[2 * q + 1]), wo, cc);
              cc = V::template fma<true>(V::bcast(xp[2 * q]), we, cc);
            }
            c[r][h] = cc;
          }
        }
      }
    }
    for (int r = 0; r < RB; ++r) {
      V::store(acc + (r0 + r) * kPeOcBlock, c[r][0]);
      V::store(acc + (r0 + r) * kPeOcBlock + 16, c[r][1]);
    }
  }
}

template <class V, int RB>
void pe_rows_any(const PatchEmbedJob& j, const float* xs, int nr, int64_t b0, int64_t b1, float* acc, PeSink sink) {
  const bool flush = j.form != PatchEmbedForm::fma_chain;
  for (int64_t b = b0; b < b1; ++b) {
    {
      typename V::Flush mode(flush);  // restored before the sink runs (the epilogue's bias add does not flush)
      switch (j.form) {
        case PatchEmbedForm::fma_chain:
          if (j.IC == 3) pe_chain<V, RB, 3>(j, xs, nr, b, acc);
          else pe_chain<V, RB, 0>(j, xs, nr, b, acc);
          break;
        case PatchEmbedForm::amx_tile:
          if (j.ICP == 4) pe_bf16<V, RB, 2, true>(j, xs, nr, b, acc);
          else pe_bf16<V, RB, 0, true>(j, xs, nr, b, acc);
          break;
        case PatchEmbedForm::dot_pairs:
          if (j.ICP == 4) pe_bf16<V, RB, 2, false>(j, xs, nr, b, acc);
          else pe_bf16<V, RB, 0, false>(j, xs, nr, b, acc);
          break;
      }
    }
    sink(b, acc);
  }
}

}  // namespace
}  // namespace opgym::detail
