// Golden reference for rotary, meant to be read against HF (transformers 5.23):
//
//   def rotate_half(x): x1, x2 = x[..., :R/2], x[..., R/2:]; return torch.cat((-x2, x1), dim=-1)
//   interleaved rotate_half: x1, x2 = x[..., 0::2], x[..., 1::2]; torch.stack((-x2, x1), -1).flatten(-2)
//   apply_rotary_pos_emb (text, mode hf):        cos = cos.unsqueeze(unsqueeze_dim) (same for sin)
//       q_rot, q_pass = q[..., :R], q[..., R:]       # R = cos.shape[-1] (partial rotary: GPT-NeoX, Phi-3)
//       q_embed = cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass])   # each op rounded to q's dtype
//   a per-pair table (GLM, Helium, Ernie 4.5): cos = cos[..., :W].repeat_interleave(2, -1) with interleaved
//       pairs; GPT-OSS's halves: first * cos - second * sin, second * cos + first * sin (cat(cos, cos))
//   apply_rotary_pos_emb_interleave (DeepSeek-V3, deinterleave): q1, q2 = q[..., 0::2], q[..., 1::2]
//       q_embed = cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin])         # cos = cos[..., :R/2]
//   mode fp32 (apply_rotary_pos_emb_vision, Cohere's, ...): q, cos, sin = q.float(), cos.float(), ...
//       then the same, and q_embed.to(orig_dtype)
//   MRoPE (PyPTO-Gym / Qwen2-VL): cos = cat([m[i % 3] for i, m in enumerate(cos.split(section * 2, -1))], -1)
//
// Op by op: the recomposed, unsqueezed (and, for a per-pair table, expanded) cos/sin row and
// rotate_half(x) are materialized per row, then the two products and the sum (DeepSeek's form: its
// own products and difference), each rounded as the mode says, then the pass-through dims. Shares the
// argument checks (and the row walk) with the front; the arithmetic is its own.
#include <vector>

#include "core/storage.hpp"
#include "opgym/rotary.hpp"
#include "ops/rotary/kernel.hpp"

namespace opgym::reference {

void rotary_basic_ops(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
                      const TensorView& q_out, const TensorView& k_out, const RotaryOptions& opt) {
  detail::RotaryJob job;
  if (!detail::make_rotary_job(q, k, cos, sin, q_out, k_out, opt, job)) return;
  const int64_t D = job.dim, R = job.rot, h = job.half;
  // Element j of the rotated part reads table entry col[j] of stream offset (MRoPE: section index mod 3
  // over mrope_section * 2) cos_stream[j] / sin_stream[j].
  std::vector<int64_t> col(R), cos_stream(R, 0), sin_stream(R, 0);
  for (int64_t j = 0; j < R; ++j)
    col[j] = !opt.pair_table ? j : opt.pairs == RotaryPairs::half ? j % h : j / 2;  // cat(cos, cos) / repeat_interleave
  if (opt.mrope()) {
    int64_t j = 0;
    for (int i = 0; i < 6; ++i)
      for (int64_t n = 0; n < opt.mrope_section[i % 3]; ++n, ++j)
        cos_stream[j] = (i % 3) * cos.strides[0], sin_stream[j] = (i % 3) * sin.strides[0];
  }
  const DType xt = job.x_dtype, ct = job.cs_dtype;
  auto r = [&](float v) { return job.hf ? round_to(xt, v) : v; };
  std::vector<float> x(D), c(R), s(R), rot(R), a(R), b(R), y(D);
  for (const detail::RotaryTensor& t : job.t) {
    for (int64_t row = 0; row < t.rows; ++row) {
      int64_t io, oo, co, so;
      t.row_offsets(row, io, oo, co, so);
      for (int64_t j = 0; j < D; ++j) x[j] = load_as_f32(xt, t.in, io + j);  // x.float() (fp32 mode) or as is
      for (int64_t j = 0; j < R; ++j) {  // cos/sin recomposed, unsqueezed, expanded
        c[j] = load_as_f32(ct, job.cos, co + cos_stream[j] + col[j]);
        s[j] = load_as_f32(ct, job.sin, so + sin_stream[j] + col[j]);
      }
      if (opt.pairs == RotaryPairs::deinterleave) {
        for (int64_t j = 0; j < h; ++j) {
          const float q1 = x[2 * j], q2 = x[2 * j + 1];
          y[j] = r(r(q1 * c[2 * j]) - r(q2 * s[2 * j]));          // q1 * cos - q2 * sin
          y[h + j] = r(r(q2 * c[2 * j]) + r(q1 * s[2 * j]));      // q2 * cos + q1 * sin
        }
      } else {
        for (int64_t j = 0; j < R; ++j)  // rotate_half, either form
          rot[j] = opt.pairs == RotaryPairs::half ? (j < h ? -x[j + h] : x[j - h]) : (j % 2 == 0 ? -x[j + 1] : x[j - 1]);
        for (int64_t j = 0; j < R; ++j) a[j] = r(x[j] * c[j]);          // q_rot * cos
        for (int64_t j = 0; j < R; ++j) b[j] = r(rot[j] * s[j]);        // rotate_half(q_rot) * sin
        for (int64_t j = 0; j < R; ++j) y[j] = a[j] + b[j];             // + (rounded at the store)
      }
      for (int64_t j = R; j < D; ++j) y[j] = x[j];                    // cat([.., q_pass])
      for (int64_t j = 0; j < D; ++j) store_from_f32(xt, t.out, oo + j, y[j]);  // (.to(orig_dtype))
    }
  }
}

}  // namespace opgym::reference
