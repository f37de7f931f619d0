// Golden reference for add_rms_norm, meant to be read against HF's decoder layer:
//
//   hidden_states = residual + hidden_states          # aten::add in the activations' dtype
//   residual = hidden_states
//   hidden_states = self.post_attention_layernorm(hidden_states)   # RMSNorm's golden
//
// torch's add of two 16-bit tensors computes a + 1 * b in fp32 and rounds once to the dtype.
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "core/storage.hpp"
#include "opgym/add_rms_norm.hpp"
#include "ops/add_rms_norm/kernel.hpp"

namespace opgym::reference {

void add_rms_norm_basic_ops(const TensorView& x, const TensorView& residual, const TensorView& weight,
                            const TensorView& out, const TensorView& sum_out, const RmsNormOptions& options) {
  if (!detail::check_add_rms_norm_args(x, residual, weight, out, sum_out, options)) return;
  const detail::AddRowsJob job = detail::add_rows_job(x, residual, sum_out);
  with_storage(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    using P = typename T::storage;
    const P* xp = reinterpret_cast<const P*>(job.x);
    const P* rp = reinterpret_cast<const P*>(job.r);
    P* sp = reinterpret_cast<P*>(job.s);
    for (int64_t row = 0; row < x.rows(); ++row) {
      int64_t xo, ro, so;
      job.row_offsets(row, xo, ro, so);
      for (int64_t i = 0; i < job.dim; ++i) {
        const float a = T::to_f32(rp[ro + i]), b = T::to_f32(xp[xo + i]);
        sp[so + i] = T::from_f32(a + b);
      }
    }
  });
  rms_norm_basic_ops(sum_out, weight, out, options);
}

}  // namespace opgym::reference
