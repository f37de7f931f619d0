// The add_rms_norm front: checks every argument (nothing is written on error), then runs, per row
// block of RMSNorm's plan, the residual add into sum_out and RMSNorm's own row kernel over that sum,
// a chunk of rows at a time so the sum is read back from L1/L2, not memory.
#include "opgym/add_rms_norm.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/checks.hpp"
#include "ops/add_rms_norm/kernel.hpp"
#include "ops/rms_norm/kernel.hpp"

namespace opgym {

namespace {
constexpr const char* kOp = "add_rms_norm";
// Rows per chunk: the chunk's sum (written by the add, read twice by the norm) stays within L1/L2.
constexpr int64_t kChunkBytes = 32 * 1024;

using AddRowsFn = void (*)(const detail::AddRowsJob&, int64_t, int64_t);
AddRowsFn add_rows_fn(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512: return detail::add_rows_avx512;
    case CpuIsa::avx2: return detail::add_rows_avx2;
    default: return detail::add_rows_scalar;
  }
}

void check_like_x(const TensorView& x, const TensorView& t, const char* name, DType dtype, const char* why) {
  if (t.rank != x.rank || !std::equal(x.shape.begin(), x.shape.begin() + x.rank, t.shape.begin()))
    throw Error(name, std::string(kOp) + ": " + name + " must have the shape of x " + x.shape_str() + ", got " +
                          t.shape_str());
  if (t.dtype != dtype)
    throw Error(name, std::string(kOp) + ": " + name + " must have dtype " + dtype_name(dtype) + " (" + why + "), got " +
                          dtype_name(t.dtype));
}

// A written tensor is either the very same elements as an input (in place) or disjoint from it.
void check_written(const TensorView& w, const char* w_name, const TensorView& in, const char* in_name) {
  if (!detail::same_memory(w, in)) detail::check_disjoint(in, in_name, w, w_name, kOp);
}
}  // namespace

namespace detail {
bool check_add_rms_norm_args(const TensorView& x, const TensorView& residual, const TensorView& weight,
                             const TensorView& out, const TensorView& sum_out, const RmsNormOptions& opt) {
  check_view(x, "x", kOp);
  check_view(residual, "residual", kOp);
  check_view(weight, "weight", kOp);
  check_view(out, "out", kOp);
  check_view(sum_out, "sum_out", kOp);
  check_like_x(x, residual, "residual", x.dtype, "x's: HF adds the residual in the activations' dtype; cast it first");
  const int64_t dim = x.last_dim();
  if (weight.rank != 1 || weight.shape[0] != dim)
    throw Error("weight", std::string(kOp) + ": weight must have shape [" + std::to_string(dim) +
                              "] (the last dim of x), got " + weight.shape_str());
  const DType out_dtype = rms_norm_out_dtype(x.dtype, weight.dtype);
  check_like_x(x, out, "out", out_dtype, "torch's promotion of weight and x");
  check_like_x(x, sum_out, "sum_out", x.dtype, "x's, the dtype HF's residual add returns");
  if (!std::isfinite(opt.eps) || opt.eps < 0)
    throw Error("eps", std::string(kOp) + ": eps must be a finite number >= 0, got " + std::to_string(opt.eps));
  if (x.numel() == 0) return false;
  check_no_self_overlap(out, "out", kOp);
  check_no_self_overlap(sum_out, "sum_out", kOp);
  check_disjoint(sum_out, "sum_out", out, "out", kOp);
  check_written(out, "out", x, "x");
  check_written(out, "out", residual, "residual");
  check_written(sum_out, "sum_out", x, "x");
  check_written(sum_out, "sum_out", residual, "residual");
  check_disjoint(weight, "weight", out, "out", kOp);
  check_disjoint(weight, "weight", sum_out, "sum_out", kOp);
  return true;
}

AddRowsJob add_rows_job(const TensorView& x, const TensorView& residual, const TensorView& sum_out) {
  AddRowsJob job;
  job.x = static_cast<const char*>(x.data);
  job.r = static_cast<const char*>(residual.data);
  job.s = static_cast<char*>(sum_out.data);
  job.dtype = x.dtype;
  job.dim = x.last_dim();
  int64_t xs = 0, rs = 0, ss = 0;
  job.collapse = leading_collapse(x, xs) && leading_collapse(residual, rs) && leading_collapse(sum_out, ss);
  job.x_row_stride = xs;
  job.r_row_stride = rs;
  job.s_row_stride = ss;
  job.lead_rank = x.rank - 1;
  for (int d = 0; d < job.lead_rank; ++d) {
    job.lead_shape[d] = x.shape[d];
    job.x_lead[d] = x.strides[d];
    job.r_lead[d] = residual.strides[d];
    job.s_lead[d] = sum_out.strides[d];
  }
  return job;
}
}  // namespace detail

void add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView& weight, const TensorView& out,
                  const TensorView& sum_out, const RmsNormOptions& opt, Executor* executor) {
  if (!detail::check_add_rms_norm_args(x, residual, weight, out, sum_out, opt)) return;
  Executor& ex = executor ? *executor : default_executor();
  const RmsNormPlan plan = detail::rms_norm_plan_of_checked(x, weight.dtype, ex.max_threads());
  const detail::RmsNormJob norm = detail::rms_norm_job(sum_out, weight, out, opt, plan);
  const detail::AddRowsJob add = detail::add_rows_job(x, residual, sum_out);
  const detail::RmsNormRowsFn norm_rows = detail::rms_norm_rows_fn(plan.isa);
  const AddRowsFn add_rows = add_rows_fn(plan.isa);
  const int64_t row_bytes = std::max<int64_t>(1, plan.dim * static_cast<int64_t>(dtype_size(x.dtype)));
  const int64_t chunk = std::max<int64_t>(kChunkBytes / row_bytes, 1);
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t c0 = r0; c0 < r1; c0 += chunk) {
      const int64_t c1 = std::min(r1, c0 + chunk);
      add_rows(add, c0, c1);
      norm_rows(norm, c0, c1);
    }
  };
  if (plan.blocks <= 1) {  // decode-sized: stay on the calling thread
    rows(0, plan.rows);
    return;
  }
  const int64_t rb = plan.row_block, total = plan.rows;
  ex.parallel_for(plan.blocks, 1, [&](int64_t b0, int64_t b1) { rows(b0 * rb, std::min(total, b1 * rb)); });
}

}  // namespace opgym
