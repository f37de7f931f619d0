// The residual add, written once over a "group of 64 floats" (S) and compiled per instruction set.
// Each element is widened to fp32, added (one fp32 rounding, as torch's add computes a + 1 * b in
// fp32 for 16-bit dtypes), and rounded back to the dtype to nearest even: HF eager's bits.
#pragma once
#include <cstdint>

#include "core/storage.hpp"
#include "ops/add_rms_norm/kernel.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see core/convert.hpp

template <class S, class T>
void add_row(const typename T::storage* x, const typename T::storage* r, typename T::storage* s, int64_t dim) {
  constexpr int64_t kG = S::kGroup;
  int64_t i = 0;
  for (; i + kG <= dim; i += kG)
    S::template store<T>(s + i, S::add(S::template load<T>(x + i), S::template load<T>(r + i)));
  if (i < dim) {
    const int64_t n = dim - i;
    S::template store_n<T>(s + i, S::add(S::template load_n<T>(x + i, n), S::template load_n<T>(r + i, n)), n);
  }
}

template <class S>
void add_rows_any(const detail::AddRowsJob& job, int64_t begin, int64_t end) {
  with_storage(job.dtype, [&](auto tag) {
    using T = decltype(tag);
    using P = typename T::storage;
    const P* x = reinterpret_cast<const P*>(job.x);
    const P* r = reinterpret_cast<const P*>(job.r);
    P* s = reinterpret_cast<P*>(job.s);
    for (int64_t row = begin; row < end; ++row) {
      int64_t xo, ro, so;
      job.row_offsets(row, xo, ro, so);
      add_row<S, T>(x + xo, r + ro, s + so, job.dim);
    }
  });
}

}  // namespace
}  // namespace opgym
