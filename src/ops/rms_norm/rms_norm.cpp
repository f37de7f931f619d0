// The RMSNorm front: checks every argument (nothing is written on error), derives the tile plan,
// and runs the per-ISA row kernel over row blocks on the executor.
#include "opgym/rms_norm.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>

#include "core/checks.hpp"
#include "opgym/cpu.hpp"
#include "ops/rms_norm/kernel.hpp"

namespace opgym {

const char* mode_name(NormMode m) { return m == NormMode::hf ? "hf" : "fp32"; }

const char* sum_order_name(SumOrder o) {
  switch (o) {
    case SumOrder::automatic: return "automatic";
    case SumOrder::torch_cpu: return "torch_cpu";
    case SumOrder::lanes64: return "lanes64";
  }
  return "?";
}

NormMode parse_mode(std::string_view n) {
  if (n == "hf") return NormMode::hf;
  if (n == "fp32") return NormMode::fp32;
  throw Error("mode", "rms_norm: mode must be 'hf' or 'fp32', got '" + std::string(n) + "'");
}

namespace {

// Input bytes a row block aims for: big enough to amortize a task claim (~100 ns), small enough
// that 2..64 threads get several blocks each on a prefill-sized tensor.
constexpr int64_t kBlockBytes = 64 * 1024;
// Below this many bytes moved (read + write) a call stays on one thread: waking workers costs
// a few microseconds, which is what a call of this size takes in total.
constexpr int64_t kParallelBytes = 256 * 1024;

std::atomic<bool> native_bf16_allowed{true};
std::atomic<int> overlap_mode{-1};
RmsNormPlan make_plan(const TensorView& x, DType weight_dtype, int threads);

}  // namespace

namespace detail {
RmsNormRowsFn rms_norm_rows_fn(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512: return rms_norm_rows_avx512;
    case CpuIsa::avx2: return rms_norm_rows_avx2;
    default: return rms_norm_rows_scalar;
  }
}
RmsNormPlan rms_norm_plan_of_checked(const TensorView& x, DType weight_dtype, int threads) {
  return make_plan(x, weight_dtype, threads);
}
bool native_bf16_enabled() {
  return cpu_has(CpuFeature::avx512_bf16) && native_bf16_allowed.load(std::memory_order_relaxed);
}
void set_native_bf16(bool enabled) { native_bf16_allowed.store(enabled, std::memory_order_relaxed); }
void set_overlap_mode(int mode) { overlap_mode.store(mode, std::memory_order_relaxed); }
}  // namespace detail

RmsNormPlan plan_rms_norm(const TensorView& x, DType weight_dtype, int threads) {
  detail::check_view(x, "x", "rms_norm", /*need_data=*/false);
  return make_plan(x, weight_dtype, threads);
}

namespace {
// The plan of a view already checked.
RmsNormPlan make_plan(const TensorView& x, DType weight_dtype, int threads) {
  RmsNormPlan p;
  p.dim = x.last_dim();
  p.rows = x.rows();
  p.x_dtype = x.dtype;
  p.w_dtype = weight_dtype;
  p.out_dtype = rms_norm_out_dtype(x.dtype, weight_dtype);
  int64_t rs;
  p.rows_collapse = detail::leading_collapse(x, rs);
  p.isa = active_cpu_isa();
  p.vector_elems = p.isa == CpuIsa::avx512 ? 16 : p.isa == CpuIsa::avx2 ? 8 : 1;
  p.vector_body = p.dim - p.dim % kSumLanes;  // every path's group is kSumLanes wide
  p.batch_rows = detail::batch_rows(p.dim, dtype_size(x.dtype));
  const bool all_bf16 = x.dtype == DType::bfloat16 && weight_dtype == DType::bfloat16;
  if (p.isa == CpuIsa::avx512 && all_bf16)
    p.conversions = detail::native_bf16_enabled()
                        ? "bf16 even/odd lanes; rows proven free of NaN/subnormal results round h by a two-instruction "
                          "FMA split (Veltkamp's split where the row holds a zero) and y by AVX512-BF16, other rows by "
                          "exact integer rounding"
                        : "bf16 even/odd lanes; exact integer rounding";
  else if (p.isa == CpuIsa::scalar)
    p.conversions = "scalar, bit-exact with torch";
  else
    p.conversions = "F16C for fp16, integer round-to-nearest-even for bf16";
  p.tail = p.dim - p.vector_body;
  const int64_t row_bytes = std::max<int64_t>(1, p.dim * static_cast<int64_t>(dtype_size(x.dtype)));
  // Threads write whole row blocks; a block of a contiguous output should end on a 64-byte line, or
  // two threads write the same line at every block boundary. Rows of out_row bytes reach one after a
  // multiple of 64 / gcd(out_row, 64) rows (1 for every row length that is a multiple of 64 bytes).
  // Rows so long that a block holds fewer keep their blocks: a line shared per >= 32 KiB is noise, and
  // fewer, larger blocks would leave threads idle.
  const int64_t out_row = p.dim * static_cast<int64_t>(dtype_size(p.out_dtype));
  const int64_t line_rows = out_row > 0 ? 64 / std::gcd<int64_t>(out_row, 64) : 1;
  const int64_t by_bytes = std::max<int64_t>(1, kBlockBytes / row_bytes);
  p.row_block = by_bytes >= line_rows ? by_bytes / line_rows * line_rows : by_bytes;
  p.blocks = p.rows == 0 ? 0 : (p.rows + p.row_block - 1) / p.row_block;
  const int64_t moved = p.rows * p.dim * static_cast<int64_t>(dtype_size(x.dtype) + dtype_size(p.out_dtype));
  const int avail = threads > 0 ? threads : default_executor().max_threads();
  if (moved < kParallelBytes || p.blocks < 2) {
    p.threads = 1;
    p.row_block = std::max<int64_t>(p.rows, 1);
    p.blocks = p.rows == 0 ? 0 : 1;
  } else {
    p.threads = static_cast<int>(std::min<int64_t>(avail, p.blocks));
  }
  const int overlap = overlap_mode.load(std::memory_order_relaxed);
  const int64_t per_thread = p.rows * row_bytes / p.threads;
  p.overlapped = overlap == 1 ||
                 (overlap == -1 && p.rows >= 2 &&
                  ((row_bytes >= detail::kOverlapLongRowBytes && per_thread >= detail::kOverlapLongBytesPerThread) ||
                   (row_bytes >= detail::kOverlapRowBytes && per_thread >= detail::kOverlapBytesPerThread)));
  return p;
}
}  // namespace

std::string RmsNormPlan::describe() const {
  std::ostringstream o;
  o << "rms_norm plan\n"
    << "  dtypes        x " << dtype_name(x_dtype) << ", weight " << dtype_name(w_dtype) << " -> out "
    << dtype_name(out_dtype) << "\n"
    << "  rows          " << rows << " (leading dims " << (rows_collapse ? "collapse to one row stride" : "walked by index")
    << ")\n"
    << "  last dim      " << dim << " handled whole: " << vector_body / kSumLanes << " groups of " << kSumLanes
    << " (" << (isa == CpuIsa::scalar ? "scalar lanes" : std::to_string(kSumLanes / vector_elems) + " x " +
                                                           std::to_string(vector_elems) + "-lane vectors")
    << ") + tail " << tail << "\n"
    << "  row blocks    " << blocks << " of " << row_block << " rows (threads claim blocks one at a time)\n"
    << (overlapped ? std::string("  row order     overlapped: pass 2 of each row inside pass 1 of the next\n")
                   : "  row batches   " + std::to_string(batch_rows) + " rows: sums first, then sqrt/divide, then scaling\n")
    << "  threads       " << threads << "\n"
    << "  isa           " << isa_name(isa) << "\n"
    << "  conversions   " << conversions << "\n";
  return o.str();
}

namespace detail {
bool check_rms_norm_args(const TensorView& x, const TensorView& weight, const TensorView& out, const RmsNormOptions& opt) {
  static constexpr const char* op = "rms_norm";
  check_view(x, "x", op);
  check_view(weight, "weight", op);
  check_view(out, "out", op);
  const int64_t dim = x.last_dim();
  if (weight.rank != 1 || weight.shape[0] != dim)
    throw Error("weight", std::string(op) + ": weight must have shape [" + std::to_string(dim) +
                              "] (the last dim of x), got " + weight.shape_str());
  const DType out_dtype = rms_norm_out_dtype(x.dtype, weight.dtype);
  if (out.rank != x.rank || !std::equal(x.shape.begin(), x.shape.begin() + x.rank, out.shape.begin()))
    throw Error("out", std::string(op) + ": out must have the shape of x " + x.shape_str() + ", got " + out.shape_str());
  if (out.dtype != out_dtype)
    throw Error("out", std::string(op) + ": out must have dtype " + dtype_name(out_dtype) + " (promotion of weight " +
                           dtype_name(weight.dtype) + " and x " + dtype_name(x.dtype) + "), got " + dtype_name(out.dtype));
  if (!std::isfinite(opt.eps) || opt.eps < 0)
    throw Error("eps", std::string(op) + ": eps must be a finite number >= 0, got " + std::to_string(opt.eps));
  if (x.numel() == 0) return false;  // zero rows (or a zero last dim): nothing to do
  check_no_self_overlap(out, "out", op);
  if (!same_memory(x, out)) check_disjoint(x, "x", out, "out", op);
  check_disjoint(weight, "weight", out, "out", op);
  return true;
}
}  // namespace detail

namespace detail {
RmsNormJob rms_norm_job(const TensorView& x, const TensorView& weight, const TensorView& out, const RmsNormOptions& opt,
                        const RmsNormPlan& plan) {
  RmsNormJob job;
  job.x = static_cast<const char*>(x.data);
  job.w = static_cast<const char*>(weight.data);
  job.out = static_cast<char*>(out.data);
  job.x_dtype = x.dtype;
  job.w_dtype = weight.dtype;
  job.out_dtype = out.dtype;
  job.mode = opt.mode;
  job.weight_offset = opt.weight_offset;
  job.native_bf16 = plan.isa == CpuIsa::avx512 && native_bf16_enabled();
  job.eps = static_cast<float>(opt.eps);
  job.torch_order = opt.sum_order != SumOrder::lanes64;
  job.stream_out = out.numel() * static_cast<int64_t>(dtype_size(out.dtype)) >= kStreamOutBytes;
  job.overlap = plan.overlapped;
  job.dim = x.last_dim();
  int64_t xs = 0, os = 0;
  job.collapse = leading_collapse(x, xs) && leading_collapse(out, os);
  job.x_row_stride = xs;
  job.out_row_stride = os;
  job.lead_rank = x.rank - 1;
  for (int d = 0; d < job.lead_rank; ++d) {
    job.lead_shape[d] = x.shape[d];
    job.x_lead_strides[d] = x.strides[d];
    job.out_lead_strides[d] = out.strides[d];
  }
  return job;
}
}  // namespace detail

void rms_norm(const TensorView& x, const TensorView& weight, const TensorView& out,
              const RmsNormOptions& opt, Executor* executor) {
  if (!detail::check_rms_norm_args(x, weight, out, opt)) return;
  Executor& ex = executor ? *executor : default_executor();
  const RmsNormPlan plan = make_plan(x, weight.dtype, ex.max_threads());
  const detail::RmsNormJob job = detail::rms_norm_job(x, weight, out, opt, plan);
  const detail::RmsNormRowsFn fn = detail::rms_norm_rows_fn(plan.isa);
  if (plan.blocks <= 1) {  // decode-sized: stay on the calling thread
    fn(job, 0, plan.rows);
    return;
  }
  const int64_t rb = plan.row_block, rows = plan.rows;
  ex.parallel_for(plan.blocks, 1, [&](int64_t b0, int64_t b1) {
    fn(job, b0 * rb, std::min(rows, b1 * rb));
  });
}

}  // namespace opgym
