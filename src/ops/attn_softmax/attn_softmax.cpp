// The attn_softmax front: checks every argument (nothing is written on error), flattens scores, mask and
// out to rows, picks the kernel of the torch build to reproduce, and runs it over row blocks on the
// executor (each task with its own fp32 scratch row).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "opgym/attn_softmax.hpp"
#include "opgym/cpu.hpp"
#include "ops/attn_softmax/kernel.hpp"

namespace opgym {

namespace {
constexpr const char* kOp = "attn_softmax";
constexpr int64_t kBlockElems = 16 * 1024;     // elements per task (~16K exps: tens of microseconds)
constexpr int64_t kParallelElems = 32 * 1024;  // below this a call stays on the calling thread

Error err(const char* arg, const std::string& what) { return Error(arg, std::string(kOp) + ": " + what); }

using RowsFn = void (*)(const detail::AttnSoftmaxJob&, int64_t, int64_t, float*);
RowsFn rows_fn(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512: return detail::attn_softmax_rows_avx512;
    case CpuIsa::avx2: return detail::attn_softmax_rows_avx2;
    default: return detail::attn_softmax_rows_scalar;
  }
}

void run(const detail::AttnSoftmaxJob& job, CpuIsa isa, Executor* executor) {
  const RowsFn fn = rows_fn(isa);
  const int64_t scratch = (job.dim + 63) / 64 * 64;
  Executor& ex = executor ? *executor : default_executor();
  if (job.rows * job.dim < kParallelElems || ex.max_threads() <= 1 || job.rows == 1) {
    std::vector<float> x(static_cast<size_t>(scratch));
    fn(job, 0, job.rows, x.data());
    return;
  }
  const int64_t rb = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(job.dim, 1));
  const int64_t blocks = (job.rows + rb - 1) / rb;
  ex.parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> x(static_cast<size_t>(scratch));
    fn(job, b0 * rb, std::min(job.rows, b1 * rb), x.data());
  });
}
}  // namespace

namespace detail {

CpuIsa attn_softmax_isa(const AttnSoftmaxOptions& options) {
  const CpuIsa isa = options.torch_isa ? *options.torch_isa : active_cpu_isa();
  if (!cpu_supports(isa))  // (read once per process by the core)
    throw err("torch_isa", std::string("torch_isa ") + isa_name(isa) + " needs an instruction set this CPU lacks (has: " +
                               cpu_features() + ")");
  return isa;
}

bool make_attn_softmax_job(const TensorView& scores, const TensorView& out, const AttnSoftmaxOptions& opt,
                           const int64_t* cu, int64_t segments, bool block_diagonal, AttnSoftmaxJob& job) {
  check_view(scores, "scores", kOp);
  check_view(out, "out", kOp);
  if (out.rank != scores.rank || !std::equal(scores.shape.begin(), scores.shape.begin() + scores.rank, out.shape.begin()))
    throw err("out", "out must have scores' shape " + scores.shape_str() + ", got " + out.shape_str());
  if (out.dtype != scores.dtype)
    throw err("out", std::string("out must have scores' dtype ") + dtype_name(scores.dtype) + ", got " +
                         dtype_name(out.dtype));
  const TensorView* mask = opt.mask;
  if (mask) {
    check_view(*mask, "mask", kOp);
    if (mask->dtype != scores.dtype)
      throw err("mask", std::string("mask must have scores' dtype ") + dtype_name(scores.dtype) + " (HF adds it in "
                        "that dtype), got " + dtype_name(mask->dtype));
    bool ok = mask->rank == scores.rank;
    for (int d = 0; ok && d < scores.rank; ++d) ok = mask->shape[d] == scores.shape[d] || mask->shape[d] == 1;
    if (!ok)
      throw err("mask", "mask must broadcast to scores " + scores.shape_str() + " (same rank, each dim equal or 1), "
                        "got " + mask->shape_str());
    if (mask->last_dim() != scores.last_dim() && scores.last_dim() > 1)
      throw err("mask", "mask's last dim must be scores' " + std::to_string(scores.last_dim()) + " (expand it first), "
                        "got " + mask->shape_str());
  }
  if (std::isnan(opt.scale)) throw err("scale", "scale must be a number, got NaN");
  if (cu) {
    if (mask) throw err("mask", "the segmented form takes no mask (HF's vision windows have none)");
    if (scores.rank < 2)
      throw err("scores", "the segmented form needs scores [..., P, W] (rank >= 2), got " + scores.shape_str());
    const int64_t P = scores.shape[scores.rank - 2], W = scores.last_dim();
    if (segments < 1) throw err("cu_seqlens", "cu_seqlens must hold at least 2 entries (one segment), got " +
                                                  std::to_string(segments + 1));
    if (cu[0] != 0 || cu[segments] != P)
      throw err("cu_seqlens", "cu_seqlens must run from 0 to P = " + std::to_string(P) + " (scores' rows), got " +
                                  std::to_string(cu[0]) + " .. " + std::to_string(cu[segments]));
    for (int64_t i = 0; i < segments; ++i) {
      if (cu[i + 1] < cu[i])
        throw err("cu_seqlens", "cu_seqlens must not decrease, got " + std::to_string(cu[i]) + " then " +
                                    std::to_string(cu[i + 1]) + " at " + std::to_string(i));
      const int64_t need = (block_diagonal ? cu[i] : 0) + cu[i + 1] - cu[i];
      if (need > W)
        throw err("scores", "segment " + std::to_string(i) + " needs columns up to " + std::to_string(need) +
                                (block_diagonal ? " (block diagonal)" : " (packed)") + ", scores has W = " +
                                std::to_string(W));
    }
  }
  attn_softmax_isa(opt);
  if (scores.numel() == 0) return false;
  check_no_self_overlap(out, "out", kOp);
  if (!same_memory(out, scores)) check_disjoint(scores, "scores", out, "out", kOp);
  if (mask) check_disjoint(*mask, "mask", out, "out", kOp);

  job = AttnSoftmaxJob{};
  job.scores = static_cast<const char*>(scores.data);
  job.mask = mask ? static_cast<const char*>(mask->data) : nullptr;
  job.out = static_cast<char*>(out.data);
  job.dtype = scores.dtype;
  job.scale = opt.scale;
  job.rows = scores.rows();
  job.dim = scores.last_dim();
  job.lead_rank = scores.rank - 1;
  for (int d = 0; d < scores.rank - 1; ++d) {
    job.lead_shape[d] = scores.shape[d];
    job.s_lead[d] = scores.strides[d];
    job.o_lead[d] = out.strides[d];
    job.m_lead[d] = mask && mask->shape[d] > 1 ? mask->strides[d] : 0;  // broadcast dims read one row
  }
  if (cu) {
    job.cu = cu;
    job.segments = segments;
    job.period = scores.shape[scores.rank - 2];
    job.block_diagonal = block_diagonal;
  }
  return true;
}

}  // namespace detail

void attn_softmax(const TensorView& scores, const TensorView& out, const AttnSoftmaxOptions& options,
                  Executor* executor) {
  detail::AttnSoftmaxJob job;
  if (!detail::make_attn_softmax_job(scores, out, options, nullptr, 0, false, job)) return;
  run(job, detail::attn_softmax_isa(options), executor);
}

void attn_softmax_segments(const TensorView& scores, const TensorView& out, const int64_t* cu_seqlens,
                           int64_t segments, bool block_diagonal, const AttnSoftmaxOptions& options,
                           Executor* executor) {
  if (!cu_seqlens) throw err("cu_seqlens", "cu_seqlens is null");
  detail::AttnSoftmaxJob job;
  if (!detail::make_attn_softmax_job(scores, out, options, cu_seqlens, segments, block_diagonal, job)) return;
  run(job, detail::attn_softmax_isa(options), executor);
}

const char* attn_softmax_exp_library() { return OPGYM_HAVE_SLEEF ? "sleef-u10" : "glibc"; }

}  // namespace opgym
