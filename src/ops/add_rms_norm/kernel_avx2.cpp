// The residual add on the avx2 path: kernel_impl.hpp compiled with this path's Simd group.
#include "core/simd_avx2.hpp"
#include "ops/add_rms_norm/kernel_impl.hpp"

namespace opgym::detail {
void add_rows_avx2(const AddRowsJob& job, int64_t begin, int64_t end) { add_rows_any<Simd>(job, begin, end); }
}  // namespace opgym::detail
