// Golden reference for rotary, meant to be read against HF (transformers 5.23):
//
//   def rotate_half(x): x1, x2 = x[..., :D/2], x[..., D/2:]; return torch.cat((-x2, x1), dim=-1)
//   apply_rotary_pos_emb (text, mode hf):        cos = cos.unsqueeze(unsqueeze_dim) (same for sin)
//       q_embed = (q * cos) + (rotate_half(q) * sin)        # each op rounded to q's dtype
//   apply_rotary_pos_emb_vision (mode fp32):     q, cos, sin = q.float(), cos.unsqueeze(-2).float(), ...
//       q_embed = ((q * cos) + (rotate_half(q) * sin)).to(orig_dtype)
//   MRoPE (PyPTO-Gym / Qwen2-VL): cos = cat([m[i % 3] for i, m in enumerate(cos.split(section * 2, -1))], -1)
//
// Op by op: the recomposed, unsqueezed cos/sin row and rotate_half(x) are materialized per row, then
// the two products and the sum, each rounded as the mode says. Shares the argument checks (and the
// row walk) with the front; the arithmetic is its own.
#include <vector>

#include "core/storage.hpp"
#include "opgym/rotary.hpp"
#include "ops/rotary/kernel.hpp"

namespace opgym::reference {

void rotary_basic_ops(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
                      const TensorView& q_out, const TensorView& k_out, const RotaryOptions& opt) {
  detail::RotaryJob job;
  if (!detail::make_rotary_job(q, k, cos, sin, q_out, k_out, opt, job)) return;
  const int64_t D = job.dim, h = job.half;
  // The stream each element reads (MRoPE: section index mod 3 over mrope_section * 2), as an offset.
  std::vector<int64_t> cos_stream(D, 0), sin_stream(D, 0);
  if (opt.mrope()) {
    int64_t j = 0;
    for (int i = 0; i < 6; ++i)
      for (int64_t n = 0; n < opt.mrope_section[i % 3]; ++n, ++j)
        cos_stream[j] = (i % 3) * cos.strides[0], sin_stream[j] = (i % 3) * sin.strides[0];
  }
  const DType xt = job.x_dtype, ct = job.cs_dtype;
  const bool hf = job.hf;
  std::vector<float> x(D), c(D), s(D), rot(D), a(D), b(D);
  for (const detail::RotaryTensor& t : job.t) {
    for (int64_t r = 0; r < t.rows; ++r) {
      int64_t io, oo, co, so;
      t.row_offsets(r, io, oo, co, so);
      for (int64_t j = 0; j < D; ++j) {  // x.float() (fp32 mode) or x as is; cos/sin recomposed and unsqueezed
        x[j] = load_as_f32(xt, t.in, io + j);
        c[j] = load_as_f32(ct, job.cos, co + cos_stream[j] + j);
        s[j] = load_as_f32(ct, job.sin, so + sin_stream[j] + j);
      }
      for (int64_t j = 0; j < D; ++j) rot[j] = j < h ? -x[j + h] : x[j - h];       // rotate_half
      for (int64_t j = 0; j < D; ++j) a[j] = x[j] * c[j];                          // q * cos
      for (int64_t j = 0; j < D; ++j) b[j] = rot[j] * s[j];                        // rotate_half(q) * sin
      if (hf)
        for (int64_t j = 0; j < D; ++j) a[j] = round_to(xt, a[j]), b[j] = round_to(xt, b[j]);
      for (int64_t j = 0; j < D; ++j) store_from_f32(xt, t.out, oo + j, a[j] + b[j]);      // +, (.to(orig_dtype))
    }
  }
}

}  // namespace opgym::reference
