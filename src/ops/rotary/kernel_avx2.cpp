// Rotary rows on the avx2 path: kernel_impl.hpp compiled with this path's Simd group.
#include "core/simd_avx2.hpp"
#include "ops/rotary/kernel_impl.hpp"

namespace opgym::detail {
void rotary_rows_avx2(const RotaryJob& job, int64_t begin, int64_t end) { rotary_rows_any<Simd>(job, begin, end); }
}  // namespace opgym::detail
