// The rotary front: checks every argument (nothing is written on error), flattens q and k to rows
// with their cos/sin rows (HF's unsqueeze and the broadcast as strides), and runs the per-ISA kernel
// over row blocks on the executor.
#include "opgym/rotary.hpp"

#include <algorithm>
#include <string>

#include "core/checks.hpp"
#include "ops/rotary/kernel.hpp"
#include "opgym/cpu.hpp"

namespace opgym {

namespace {
constexpr const char* kOp = "rotary";
constexpr int64_t kBlockBytes = 64 * 1024;     // rows per task: ~64 KiB of q/k
constexpr int64_t kParallelBytes = 256 * 1024;  // below this a call stays on the calling thread

Error err(const char* arg, const std::string& what) { return Error(arg, std::string(kOp) + ": " + what); }

using RowsFn = void (*)(const detail::RotaryJob&, int64_t, int64_t);
RowsFn rows_fn(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512: return detail::rotary_rows_avx512;
    case CpuIsa::avx2: return detail::rotary_rows_avx2;
    default: return detail::rotary_rows_scalar;
  }
}

void check_written(const TensorView& w, const char* w_name, const TensorView& in, const char* in_name) {
  if (!detail::same_memory(w, in)) detail::check_disjoint(in, in_name, w, w_name, kOp);
}
}  // namespace

RotaryMode parse_rotary_mode(std::string_view n) {
  if (n == "hf") return RotaryMode::hf;
  if (n == "fp32") return RotaryMode::fp32;
  throw err("mode", "mode must be 'hf' or 'fp32', got '" + std::string(n) + "'");
}
const char* rotary_mode_name(RotaryMode m) { return m == RotaryMode::hf ? "hf" : "fp32"; }

RotaryPairs parse_rotary_pairs(std::string_view n) {
  if (n == "half") return RotaryPairs::half;
  if (n == "interleaved") return RotaryPairs::interleaved;
  if (n == "deinterleave") return RotaryPairs::deinterleave;
  throw err("pairs", "pairs must be 'half', 'interleaved' or 'deinterleave', got '" + std::string(n) + "'");
}
const char* rotary_pairs_name(RotaryPairs p) {
  return p == RotaryPairs::half ? "half" : p == RotaryPairs::interleaved ? "interleaved" : "deinterleave";
}

namespace detail {
bool make_rotary_job(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
                     const TensorView& q_out, const TensorView& k_out, const RotaryOptions& opt, RotaryJob& job) {
  check_view(q, "q", kOp);
  check_view(k, "k", kOp);
  check_view(cos, "cos", kOp);
  check_view(sin, "sin", kOp);
  check_view(q_out, "q_out", kOp);
  check_view(k_out, "k_out", kOp);
  const int rank = q.rank;
  const int64_t dim = q.last_dim();
  if (k.rank != rank) throw err("k", "k must have the rank of q (" + std::to_string(rank) + "), got " + k.shape_str());
  if (k.dtype != q.dtype)
    throw err("k", std::string("k must have q's dtype ") + dtype_name(q.dtype) + ", got " + dtype_name(k.dtype));
  if (k.last_dim() != dim)
    throw err("k", "k must have q's last dim " + std::to_string(dim) + ", got " + k.shape_str());
  auto like = [&](const TensorView& t, const TensorView& o, const char* name) {
    if (o.rank != t.rank || !std::equal(t.shape.begin(), t.shape.begin() + t.rank, o.shape.begin()))
      throw err(name, std::string(name) + " must have the shape " + t.shape_str() + ", got " + o.shape_str());
    if (o.dtype != t.dtype)
      throw err(name, std::string(name) + " must have dtype " + dtype_name(t.dtype) + ", got " + dtype_name(o.dtype));
  };
  like(q, q_out, "q_out");
  like(k, k_out, "k_out");
  if (sin.rank != cos.rank || !std::equal(cos.shape.begin(), cos.shape.begin() + cos.rank, sin.shape.begin()) ||
      sin.dtype != cos.dtype)
    throw err("sin", "sin must have cos's shape " + cos.shape_str() + " and dtype " + dtype_name(cos.dtype) + ", got " +
                         sin.shape_str() + " " + dtype_name(sin.dtype));
  if (opt.mode == RotaryMode::hf && cos.dtype != q.dtype)
    throw err("cos", std::string("mode hf computes in q's dtype: cos and sin must be ") + dtype_name(q.dtype) + ", got " +
                         dtype_name(cos.dtype) + " (HF casts them to the activations' dtype; mode fp32 takes any)");
  const bool mrope = opt.mrope();
  if (opt.pairs != RotaryPairs::half && opt.pairs != RotaryPairs::interleaved && opt.pairs != RotaryPairs::deinterleave)
    throw err("pairs", "pairs must be half, interleaved or deinterleave");
  if (opt.pairs == RotaryPairs::deinterleave && !opt.pair_table)
    throw err("pair_table", "deinterleave reads one cos/sin value per pair: pair_table must be set");
  if (mrope && (opt.pairs != RotaryPairs::half || opt.pair_table))
    throw err("mrope_section", "mrope_section takes rotate_half pairs and per-element tables (pairs half, no pair_table)");
  // The rotary dim: cos's last dim (one value per element) or twice it (one per pair).
  const int64_t width = cos.rank >= 1 ? cos.last_dim() : 0;
  const int64_t rot = opt.pair_table ? 2 * width : width;
  if (rot % 2 != 0 || rot < 2 || rot > dim)
    throw err("cos", std::string("cos's last dim gives the rotary dim R (") + (opt.pair_table ? "twice it, one value per pair" : "itself, one value per element") +
                         "), which must be even, from 2 to q's last dim " + std::to_string(dim) + ": got cos " + cos.shape_str());
  const int64_t half = rot / 2;
  if (mrope) {
    int64_t total = 0;
    for (int64_t s : opt.mrope_section) {
      if (s <= 0) throw err("mrope_section", "mrope_section must hold three lengths > 0");
      total += s;
    }
    if (total != half)
      throw err("mrope_section", "mrope_section must sum to half the rotary dim, " + std::to_string(half) + ", got " +
                                     std::to_string(total));
  }
  // cos as HF sees it after the unsqueeze: [*, D] (after MRoPE's leading 3) with a size-1 dim inserted.
  const int lead = mrope ? 1 : 0;
  if (cos.rank != rank - 1 + lead)
    throw err("cos", "cos must have rank " + std::to_string(rank - 1 + lead) + " (q's minus one" +
                         (mrope ? ", plus MRoPE's leading 3" : "") + "), got " + cos.shape_str());
  if (mrope && cos.shape[0] != 3)
    throw err("cos", "with mrope_section, cos must have a leading dim of 3 (t, h, w), got " + cos.shape_str());
  int ud = opt.unsqueeze_dim < 0 ? opt.unsqueeze_dim + rank : opt.unsqueeze_dim;
  if (ud < 0 || ud >= rank - 1)
    throw err("unsqueeze_dim", "unsqueeze_dim must name a dim before the last of q's " + std::to_string(rank) +
                                   " (from " + std::to_string(-rank) + " to " + std::to_string(rank - 2) + "), got " +
                                   std::to_string(opt.unsqueeze_dim));
  int64_t cshape[kMaxRank] = {}, cstr[kMaxRank] = {}, sstr[kMaxRank] = {};
  for (int d = 0, src = lead; d < rank; ++d) {
    if (d == ud) { cshape[d] = 1; continue; }
    cshape[d] = cos.shape[src], cstr[d] = cos.strides[src], sstr[d] = sin.strides[src];
    ++src;
  }
  for (int d = 0; d < rank - 1; ++d)
    for (const TensorView* t : {&q, &k})
      if (cshape[d] != 1 && cshape[d] != t->shape[d])
        throw err("cos", "cos " + cos.shape_str() + " (unsqueezed at " + std::to_string(ud) + ") does not broadcast to " +
                             (t == &q ? "q " : "k ") + t->shape_str());
  if (q.numel() == 0 && k.numel() == 0) return false;
  check_no_self_overlap(q_out, "q_out", kOp);
  check_no_self_overlap(k_out, "k_out", kOp);
  check_disjoint(q_out, "q_out", k_out, "k_out", kOp);
  for (const auto& [w, wn] : {std::pair{&q_out, "q_out"}, std::pair{&k_out, "k_out"}}) {
    check_written(*w, wn, q, "q");
    check_written(*w, wn, k, "k");
    check_disjoint(cos, "cos", *w, wn, kOp);
    check_disjoint(sin, "sin", *w, wn, kOp);
  }

  job = RotaryJob{};
  const TensorView* in[2] = {&q, &k};
  const TensorView* out[2] = {&q_out, &k_out};
  for (int i = 0; i < 2; ++i) {
    RotaryTensor& t = job.t[i];
    t.in = static_cast<const char*>(in[i]->data);
    t.out = static_cast<char*>(out[i]->data);
    t.rows = in[i]->rows();
    t.lead_rank = rank - 1;
    // Rows are walked in memory order: the leading dims sorted by x's stride, largest outermost, so
    // HF's [B, H, S, D] views of [B, S, H, D] projections are read as stored (heads innermost, each
    // position's cos/sin row reused across its heads) instead of jumping H * D elements per row.
    int order[kMaxRank];
    for (int d = 0; d < rank - 1; ++d) order[d] = d;
    std::stable_sort(order, order + rank - 1, [&](int a, int b) { return in[i]->strides[a] > in[i]->strides[b]; });
    for (int j = 0; j < rank - 1; ++j) {
      const int d = order[j];
      t.lead_shape[j] = in[i]->shape[d];
      t.in_lead[j] = in[i]->strides[d];
      t.out_lead[j] = out[i]->strides[d];
      t.cos_lead[j] = cshape[d] == 1 ? 0 : cstr[d];
      t.sin_lead[j] = cshape[d] == 1 ? 0 : sstr[d];
    }
  }
  job.cos = static_cast<const char*>(cos.data);
  job.sin = static_cast<const char*>(sin.data);
  job.x_dtype = q.dtype;
  job.cs_dtype = cos.dtype;
  job.hf = opt.mode == RotaryMode::hf;
  job.dim = dim;
  job.rot = rot;
  job.half = half;
  job.pairs = opt.pairs;
  job.pair_table = opt.pair_table;
  if (mrope) {
    job.segments = 3;
    int64_t b = 0;
    for (int s = 0; s < 3; ++s) {
      job.seg_begin[s] = b;
      job.seg_len[s] = opt.mrope_section[s];
      job.seg_cos[s] = s * cos.strides[0];
      job.seg_sin[s] = s * sin.strides[0];
      b += opt.mrope_section[s];
    }
  } else {
    job.segments = 1;
    job.seg_len[0] = half;
  }
  return true;
}
}  // namespace detail

void rotary(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
            const TensorView& q_out, const TensorView& k_out, const RotaryOptions& opt, Executor* executor) {
  detail::RotaryJob job;
  if (!detail::make_rotary_job(q, k, cos, sin, q_out, k_out, opt, job)) return;
  const RowsFn fn = rows_fn(active_cpu_isa());
  const int64_t rows = job.t[0].rows + job.t[1].rows;
  const int64_t row_bytes = job.dim * static_cast<int64_t>(dtype_size(q.dtype));  // rotated or copied
  Executor& ex = executor ? *executor : default_executor();
  if (rows * row_bytes * 2 < kParallelBytes || ex.max_threads() <= 1) {
    fn(job, 0, rows);
    return;
  }
  const int64_t rb = std::max<int64_t>(1, kBlockBytes / row_bytes), blocks = (rows + rb - 1) / rb;
  ex.parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) { fn(job, b0 * rb, std::min(rows, b1 * rb)); });
}

}  // namespace opgym
