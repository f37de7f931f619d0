// RMSNorm rows on the scalar path: kernel_impl.hpp compiled with this path's Simd group.
#include "core/simd_scalar.hpp"
#include "ops/rms_norm/kernel_impl.hpp"

namespace opgym::detail {
void rms_norm_rows_scalar(const RmsNormJob& job, int64_t begin, int64_t end) { rows_any(job, begin, end); }
void round_f32_scalar(DType to, const float* in, void* out, int64_t n) { round_f32_any(to, in, out, n); }
}  // namespace opgym::detail
