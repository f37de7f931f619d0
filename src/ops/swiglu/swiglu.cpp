// The swiglu front: checks every argument (nothing is written on error), flattens gate, up and out to
// rows, works out (fp32 only) which elements torch's silu computes with glibc's expf (for the layout
// it saw: SwigluOptions::silu_layout), and runs the
// per-ISA kernel over row blocks on the executor.
#include "opgym/swiglu.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "core/convert.hpp"
#include "opgym/cpu.hpp"
#include "ops/swiglu/kernel.hpp"

namespace opgym {

namespace {
constexpr const char* kOp = "swiglu";
constexpr int64_t kBlockBytes = 64 * 1024;      // rows per task: ~64 KiB of gate
constexpr int64_t kParallelBytes = 256 * 1024;  // below this a call stays on the calling thread

Error err(const char* arg, const std::string& what) { return Error(arg, std::string(kOp) + ": " + what); }

using RowsFn = void (*)(const detail::SwigluJob&, int64_t, int64_t);
RowsFn rows_fn(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512: return detail::swiglu_rows_avx512;
    case CpuIsa::avx2: return detail::swiglu_rows_avx2;
    default: return detail::swiglu_rows_scalar;
  }
}

void check_written(const TensorView& w, const char* w_name, const TensorView& in, const char* in_name) {
  if (!detail::same_memory(w, in)) detail::check_disjoint(in, in_name, w, w_name, kOp);
}
}  // namespace

namespace detail {

std::vector<int64_t> torch_silu_libm_ranges(int64_t n, int threads, int64_t step, int64_t run) {
  std::vector<int64_t> ranges;
  if (n <= 0 || step <= 0) return ranges;
  if (run <= 0) return {0, n};  // no vector body: torch's basic_loop (glibc's expf) everywhere
  constexpr int64_t kGrain = 32768;  // at::internal::GRAIN_SIZE, TensorIterator::for_each's default
  int64_t chunks = 1;
  if (n >= kGrain && threads > 1) chunks = std::min<int64_t>(threads, (n + kGrain - 1) / kGrain);
  const int64_t size = (n + chunks - 1) / chunks;  // at::parallel_for's chunk (divup), from 0
  for (int64_t b = 0; b < n; b += size) {
    const int64_t e = std::min(n, b + size);
    // serial_for_each: one inner-loop call per row segment of the chunk (DimCounter::max_2d_step)
    for (int64_t s = b; s < e;) {
      const int64_t se = std::min(e, (s / run + 1) * run);
      const int64_t tail = s + (se - s) / step * step;  // vectorized_loop: whole steps, then basic_loop
      if (tail < se) ranges.insert(ranges.end(), {tail, se});
      s = se;
    }
  }
  return ranges;
}

int64_t torch_silu_run(const TensorView& gate) {
  int64_t run = 0, stride = 0;
  for (int d = gate.rank - 1; d >= 0; --d) {
    if (gate.shape[d] == 1) continue;  // size-1 dims always coalesce
    if (run == 0) {
      run = gate.shape[d], stride = gate.strides[d];
    } else if (gate.strides[d] == stride * run) {
      run *= gate.shape[d];
    } else {
      break;
    }
  }
  if (run == 0) return gate.numel();  // a single element
  return stride == 1 ? run : 0;
}

const uint16_t* swiglu_silu_table(DType dtype) {
  auto build = [](DType t) {
    std::vector<uint16_t> v(65536 + 2, 0);
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint16_t h = static_cast<uint16_t>(b);
      const float g = t == DType::bfloat16 ? bf16_to_f32(h) : f16_to_f32(h);
      const float s = g / (1.0f + std::exp(-g));
      v[b] = t == DType::bfloat16 ? f32_to_bf16(s) : f32_to_f16(s);
    }
    return v;
  };
  if (dtype == DType::bfloat16) {
    static const std::vector<uint16_t> bf16 = build(DType::bfloat16);
    return bf16.data();
  }
  if (dtype == DType::float16) {
    static const std::vector<uint16_t> f16 = build(DType::float16);
    return f16.data();
  }
  return nullptr;
}

int64_t torch_silu_fp32_step(int isa) {
  switch (static_cast<CpuIsa>(isa)) {
    case CpuIsa::avx512: return 32;
    case CpuIsa::avx2: return 16;
    default: return 0;
  }
}

bool make_swiglu_job(const TensorView& gate, const TensorView& up, const TensorView& out, SwigluJob& job) {
  check_view(gate, "gate", kOp);
  check_view(up, "up", kOp);
  check_view(out, "out", kOp);
  auto like = [&](const TensorView& t, const char* name) {
    if (t.rank != gate.rank || !std::equal(gate.shape.begin(), gate.shape.begin() + gate.rank, t.shape.begin()))
      throw err(name, std::string(name) + " must have gate's shape " + gate.shape_str() + ", got " + t.shape_str());
    if (t.dtype != gate.dtype)
      throw err(name, std::string(name) + " must have gate's dtype " + dtype_name(gate.dtype) + ", got " +
                          dtype_name(t.dtype));
  };
  like(up, "up");
  like(out, "out");
  if (gate.numel() == 0) return false;
  check_no_self_overlap(out, "out", kOp);
  check_written(out, "out", gate, "gate");
  check_written(out, "out", up, "up");
  job = SwigluJob{};
  job.gate = static_cast<const char*>(gate.data);
  job.up = static_cast<const char*>(up.data);
  job.out = static_cast<char*>(out.data);
  job.dtype = gate.dtype;
  job.rows = gate.rows();
  job.dim = gate.last_dim();
  job.lead_rank = gate.rank - 1;
  for (int d = 0; d < gate.rank - 1; ++d) {
    job.lead_shape[d] = gate.shape[d];
    job.gate_lead[d] = gate.strides[d];
    job.up_lead[d] = up.strides[d];
    job.out_lead[d] = out.strides[d];
  }
  return true;
}

void split_gate_up(const TensorView& gate_up, const TensorView& out, TensorView& gate, TensorView& up) {
  check_view(gate_up, "gate_up", kOp);
  check_view(out, "out", kOp);
  const int64_t two_i = gate_up.last_dim();
  if (two_i % 2 != 0)
    throw err("gate_up", "gate_up's last dim holds gate then up and must be even (2 * I), got " + gate_up.shape_str());
  TensorView expect = gate_up;
  expect.shape[gate_up.rank - 1] = two_i / 2;
  if (out.rank != gate_up.rank || !std::equal(expect.shape.begin(), expect.shape.begin() + expect.rank, out.shape.begin()))
    throw err("out", "out must have the shape " + expect.shape_str() + " (gate_up's with the last dim halved), got " +
                         out.shape_str());
  gate = expect;
  up = expect;
  up.data = static_cast<char*>(gate_up.data) + (two_i / 2) * static_cast<int64_t>(dtype_size(gate_up.dtype));
  if (gate_up.numel() == 0) up.data = gate_up.data;
}

}  // namespace detail

void swiglu(const TensorView& gate, const TensorView& up, const TensorView& out, const SwigluOptions& opt,
            Executor* executor) {
  if (opt.torch_threads < 1)
    throw err("torch_threads", "torch_threads must be >= 1, got " + std::to_string(opt.torch_threads));
  if (opt.silu_layout != SiluLayout::contiguous && opt.silu_layout != SiluLayout::as_given)
    throw err("silu_layout", "silu_layout must be contiguous or as_given, got " +
                                 std::to_string(static_cast<int>(opt.silu_layout)));
  detail::SwigluJob job;
  if (!detail::make_swiglu_job(gate, up, out, job)) return;
  const CpuIsa isa = active_cpu_isa();
  std::vector<int64_t> ranges;
  if (job.dtype == DType::float32) {
    const int64_t n = job.rows * job.dim;
    ranges = detail::torch_silu_libm_ranges(n, opt.torch_threads, detail::torch_silu_fp32_step(static_cast<int>(isa)),
                                           opt.silu_layout == SiluLayout::as_given ? detail::torch_silu_run(gate) : n);
    job.libm_ranges = ranges.data();
    job.libm_count = static_cast<int64_t>(ranges.size() / 2);
  }
  if (job.dtype != DType::float32) job.silu_table = detail::swiglu_silu_table(job.dtype);
  const RowsFn fn = rows_fn(isa);
  const int64_t row_bytes = job.dim * static_cast<int64_t>(dtype_size(job.dtype));
  Executor& ex = executor ? *executor : default_executor();
  if (job.rows * row_bytes < kParallelBytes || ex.max_threads() <= 1) {
    fn(job, 0, job.rows);
    return;
  }
  const int64_t rb = std::max<int64_t>(1, kBlockBytes / row_bytes), blocks = (job.rows + rb - 1) / rb;
  ex.parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) { fn(job, b0 * rb, std::min(job.rows, b1 * rb)); });
}

const char* swiglu_exp_library() { return OPGYM_HAVE_SLEEF ? "sleef-u10" : "glibc"; }

void swiglu_merged(const TensorView& gate_up, const TensorView& out, const SwigluOptions& opt, Executor* executor) {
  TensorView gate, up;
  detail::split_gate_up(gate_up, out, gate, up);
  swiglu(gate, up, out, opt, executor);
}

}  // namespace opgym
