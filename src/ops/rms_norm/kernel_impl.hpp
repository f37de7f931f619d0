// The RMSNorm CPU kernel, written once over a "group of 32 floats" (Simd::G) and compiled once per
// instruction set (kernel_scalar.cpp, kernel_avx2.cpp, kernel_avx512.cpp). Include after a simd_*.hpp.
//
// Why it is shaped this way:
// - Two passes over a row: sum of squares, then scale and store. A row of a transformer (<= 16 KiB
//   in bf16) stays in L1/L2 between the passes, so memory sees one read and one write per element.
// - Products and sums are separate roundings (mul then add, no FMA; the build sets
//   -ffp-contract=off) because HF materializes x.pow(2) in fp32 before summing.
// - Element i adds into lane i mod 32 on every ISA and the 32 lanes fold by halves, so scalar, AVX2
//   and AVX-512 give the same bits, and the basic-op golden can reproduce them.
// - A row's last partial group (dim not a multiple of 32) goes through a zero-padded stack buffer:
//   zeros add nothing to the sum, and only the valid elements are copied out. No heap, no masks.
#pragma once
#include <cmath>
#include <cstring>

#include "ops/rms_norm/kernel.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see core/convert.hpp

using G = Simd::G;

template <class TX, class TW, class TO, bool kHf>
void rows_impl(const detail::RmsNormJob& job, int64_t begin, int64_t end) {
  using SX = typename TX::storage;
  using SW = typename TW::storage;
  using SO = typename TO::storage;
  const int64_t dim = job.dim, body = dim - dim % 32, tail = dim - body;
  const SW* w = reinterpret_cast<const SW*>(job.w);
  const G one = Simd::splat(1.0f);
  const bool offset = job.weight_offset;

  // Tail scratch, zero-padded; the weight tail is loaded once per call.
  alignas(64) SX xt[32];
  alignas(64) SW wt[32];
  alignas(64) SO ot[32];
  std::memset(wt, 0, sizeof wt);
  if (tail) std::memcpy(wt, w + body, tail * sizeof(SW));

  for (int64_t r = begin; r < end; ++r) {
    int64_t xo, oo;
    job.row_offsets(r, xo, oo);
    const SX* x = reinterpret_cast<const SX*>(job.x) + xo;
    SO* out = reinterpret_cast<SO*>(job.out) + oo;
    if (tail) {
      std::memset(xt, 0, sizeof xt);
      std::memcpy(xt, x + body, tail * sizeof(SX));
    }

    G acc = Simd::splat(0.0f);
    for (int64_t i = 0; i < body; i += 32) {
      const G v = Simd::template load<TX>(x + i);
      acc = Simd::add(acc, Simd::mul(v, v));
    }
    if (tail) {
      const G v = Simd::template load<TX>(xt);
      acc = Simd::add(acc, Simd::mul(v, v));
    }
    const float var = Simd::fold(acc) / static_cast<float>(dim);
    const G rinv = Simd::splat(1.0f / std::sqrt(var + job.eps));

    auto scale = [&](const SX* xp, const SW* wp) {
      G h = Simd::mul(Simd::template load<TX>(xp), rinv);
      if constexpr (kHf) h = Simd::template round_trip<TX>(h);
      G wv = Simd::template load<TW>(wp);
      if (offset) wv = Simd::add(wv, one);
      return Simd::mul(wv, h);
    };
    for (int64_t i = 0; i < body; i += 32) Simd::template store<TO>(out + i, scale(x + i, w + i));
    if (tail) {
      Simd::template store<TO>(ot, scale(xt, wt));
      std::memcpy(out + body, ot, tail * sizeof(SO));
    }
  }
}

template <bool kHf>
void dispatch_rows(const detail::RmsNormJob& job, int64_t begin, int64_t end) {
  with_storage(job.x_dtype, [&](auto tx) {
    with_storage(job.w_dtype, [&](auto tw) {
      using TX = decltype(tx);
      using TW = decltype(tw);
      if (job.out_dtype == DType::float32) {
        rows_impl<TX, TW, F32, kHf>(job, begin, end);
      } else if constexpr (TX::dtype == TW::dtype) {
        rows_impl<TX, TW, TX, kHf>(job, begin, end);
      }
    });
  });
}

void rows_any(const detail::RmsNormJob& job, int64_t begin, int64_t end) {
  if (job.mode == NormMode::hf) dispatch_rows<true>(job, begin, end);
  else dispatch_rows<false>(job, begin, end);
}

// This path's vector conversion fp32 -> `to` over n (a multiple of 32) values: lets the tests hold
// every path's rounding to the scalar reference on ties, subnormals, overflow and NaN.
void round_f32_any(DType to, const float* in, void* out, int64_t n) {
  with_storage(to, [&](auto tag) {
    using T = decltype(tag);
    auto* o = static_cast<typename T::storage*>(out);
    for (int64_t i = 0; i + 32 <= n; i += 32) Simd::template store<T>(o + i, Simd::template load<F32>(in + i));
  });
}

}  // namespace
}  // namespace opgym
