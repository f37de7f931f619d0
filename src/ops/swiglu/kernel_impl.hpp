// The swiglu CPU kernel, written once over a "group of 64 floats" (S) and the path's math (E: Sleef's
// u10 exp and tanh and an fma on the vector paths; glibc's expf and tanhf and no fma on the scalar
// path), compiled per instruction set. Per group: gate and up are loaded before out is stored, so out
// may be either of them (in place).
// fp32 silu: each step is its own rounding, as torch's: -g (exact), exp, 1 + e, g / (1 + e) (IEEE
// divide, no reciprocal); gelu_tanh: gelu_tanh_group below; the product is rounded at the store.
// Groups that hold elements of torch's scalar tails recompute those lanes as its scalar lambda does
// (glibc; gelu_tanh with the fma its FMA builds contract).
// bf16/fp16 take the rounded activation from a 65,536-entry table instead (E::lookup: a gather), which
// holds exactly what the steps above give for each gate value (docs/PERF.md, swiglu v2); tail lanes
// (gelu_tanh only: silu's two paths round alike) from the tail table.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/storage.hpp"
#include "ops/swiglu/kernel.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see core/convert.hpp


inline float silu_libm(float g) { return g / (1.0f + std::exp(-g)); }

// The first libm range that ends after flat element `e` (binary search: a strided gate has one range
// per row).
inline int64_t first_range(const detail::SwigluJob& job, int64_t e) {
  int64_t lo = 0, hi = job.libm_count;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (job.libm_ranges[2 * mid + 1] <= e) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// gelu_tanh on a group as torch's vector body computes it: x3 = (g * g) * g, inner = beta * (kappa * x3 +
// g) (one fma where the path's build contracts it: E::madd), (0.5 * g) * (1 + tanh(inner)).
template <class S, class E>
typename S::G gelu_tanh_group(const typename S::G& g) {
  using G = typename S::G;
  const G beta = S::splat(static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5)), kappa = S::splat(0.044715f);
  const G half = S::splat(0.5f), one = S::splat(1.0f);
  const G x3 = S::mul(S::mul(g, g), g);
  const G inner = S::mul(beta, E::madd(kappa, x3, g));
  return S::mul(S::mul(half, g), S::add(one, E::tanh(inner)));
}

template <class S, class E, class T>
void swiglu_row(const detail::SwigluJob& job, const typename T::storage* gate, const typename T::storage* up,
                typename T::storage* out, int64_t flat) {
  using G = typename S::G;
  const int64_t dim = job.dim;
  const G one = S::splat(1.0f), minus = S::splat(-1.0f);
  const bool gelu = job.act == GluActivation::gelu_tanh;
  int64_t range = first_range(job, flat);  // the first libm range ending after this row's start
  for (int64_t j = 0; j < dim; j += S::kGroup) {
    const int64_t n = dim - j < S::kGroup ? dim - j : S::kGroup;
    G s;
    if constexpr (T::dtype != DType::float32) {
      // 16-bit: the rounded activation of every one of the 65,536 gate values is in job.act_table
      // (built once with the vector body's steps), looked up instead of computed.
      s = E::template lookup<T>(job.act_table, gate + j, n);
    } else {
      const G g = load_some<S, T>(gate + j, n);
      s = gelu ? gelu_tanh_group<S, E>(g) : S::div(g, S::add(one, E::exp(S::mul(g, minus))));
    }
    // lanes [lo, hi) of this group that torch computes on its scalar path (glibc's expf / tanhf)
    while (range < job.libm_count && job.libm_ranges[2 * range + 1] <= flat + j) ++range;
    if (range < job.libm_count && job.libm_ranges[2 * range] < flat + j + n) {
      alignas(64) float ss[S::kGroup];
      S::store_raw(ss, s);
      for (int64_t r = range; r < job.libm_count && job.libm_ranges[2 * r] < flat + j + n; ++r) {
        const int64_t lo = std::max<int64_t>(job.libm_ranges[2 * r] - flat - j, 0);
        const int64_t hi = std::min<int64_t>(job.libm_ranges[2 * r + 1] - flat - j, n);
        for (int64_t k = lo; k < hi; ++k) {
          if constexpr (T::dtype != DType::float32) {
            ss[k] = T::to_f32(job.tail_table[static_cast<uint16_t>(gate[j + k])]);
          } else {
            const float gk = T::to_f32(gate[j + k]);
            ss[k] = gelu ? detail::gelu_tanh_libm(gk, E::kFma) : silu_libm(gk);
          }
        }
      }
      s = S::load_raw(ss);
    }
    store_some<S, T>(out + j, S::mul(s, load_some<S, T>(up + j, n)), n);
  }
}

template <class S, class E, class T>
void rows_typed(const detail::SwigluJob& job, int64_t begin, int64_t end) {
  using P = typename T::storage;
  const int in = job.lead_rank - 1;  // the innermost leading dim (none for a single row)
  for (int64_t r = begin; r < end;) {
    int64_t go, uo, oo;
    job.row_offsets(r, go, uo, oo);
    const int64_t inner = in >= 0 ? job.lead_shape[in] : 1;
    const int64_t run = std::min<int64_t>(end - r, inner - (in >= 0 ? r % inner : 0));
    const int64_t dg = in >= 0 ? job.gate_lead[in] : 0, du = in >= 0 ? job.up_lead[in] : 0,
                  dout = in >= 0 ? job.out_lead[in] : 0;
    const P* g = reinterpret_cast<const P*>(job.gate) + go;
    const P* u = reinterpret_cast<const P*>(job.up) + uo;
    P* o = reinterpret_cast<P*>(job.out) + oo;
    for (int64_t n = 0; n < run; ++n)
      swiglu_row<S, E, T>(job, g + n * dg, u + n * du, o + n * dout, (r + n) * job.dim);
    r += run;
  }
}

template <class S, class E>
void swiglu_rows_any(const detail::SwigluJob& job, int64_t begin, int64_t end) {
  with_storage(job.dtype, [&](auto t) { rows_typed<S, E, decltype(t)>(job, begin, end); });
}

}  // namespace
}  // namespace opgym
