// RMSNorm rows on the avx2 path: kernel_impl.hpp compiled with this path's Simd group.
#include "core/simd_avx2.hpp"
#include "ops/rms_norm/kernel_impl.hpp"

namespace opgym::detail {
void rms_norm_rows_avx2(const RmsNormJob& job, int64_t begin, int64_t end) { rows_any(job, begin, end); }
void round_f32_avx2(DType to, const float* in, void* out, int64_t n) { round_f32_any(to, in, out, n); }
}  // namespace opgym::detail
