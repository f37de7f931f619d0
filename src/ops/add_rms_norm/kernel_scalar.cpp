// The residual add on the scalar path: kernel_impl.hpp compiled with this path's Simd group.
#include "core/simd_scalar.hpp"
#include "ops/add_rms_norm/kernel_impl.hpp"

namespace opgym::detail {
void add_rows_scalar(const AddRowsJob& job, int64_t begin, int64_t end) { add_rows_any<Simd>(job, begin, end); }
}  // namespace opgym::detail
