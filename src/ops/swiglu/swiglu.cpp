// The swiglu front: checks every argument (nothing is written on error), flattens gate, up and out to
// rows, works out which elements torch's activation computes on its scalar path (glibc's expf / tanhf:
// for the layout it saw, SwigluOptions::gate_layout, and its chunking), picks the 16-bit tables, and
// runs the per-ISA kernel over row blocks on the executor.
#include "opgym/swiglu.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
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

std::vector<int64_t> torch_libm_ranges(int64_t n, int threads, int64_t step, int64_t run, int64_t grain) {
  std::vector<int64_t> ranges;
  if (n <= 0 || step <= 0) return ranges;
  if (run <= 0) return {0, n};  // no vector body: torch's basic_loop (glibc's expf / tanhf) everywhere
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = 1;  // at::parallel_for: serial below the grain or on one thread
  if (n >= grain && threads > 1) chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
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

float gelu_tanh_libm(float g, bool fma) {
  const float beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
  const float x3 = g * g * g;
  const float inner = beta * (fma ? std::fma(kappa, x3, g) : g + kappa * x3);
  return 0.5f * g * (1.0f + std::tanh(inner));
}

namespace {
// One 16-bit table: f applied to every bit pattern's value, rounded to the dtype; 2 entries of padding.
template <class F>
std::vector<uint16_t> build_table(DType t, F&& f) {
  std::vector<float> in(65536), val(65536);
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    in[b] = t == DType::bfloat16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  f(in.data(), val.data());
  std::vector<uint16_t> v(65536 + 2, 0);
  for (uint32_t b = 0; b < 65536; ++b) v[b] = t == DType::bfloat16 ? f32_to_bf16(val[b]) : f32_to_f16(val[b]);
  return v;
}
}  // namespace

const uint16_t* swiglu_act_table(DType dtype, GluActivation a, ActTable kind, int isa) {
  if (dtype != DType::bfloat16 && dtype != DType::float16) return nullptr;
  const int d = dtype == DType::bfloat16 ? 0 : 1;
  // slot: 0 silu (every path), 1 gelu_tanh plain, 2 gelu_tanh tail, 3 gelu_tanh avx2 body, 4 avx512 body
  int slot = 0;
  if (a == GluActivation::gelu_tanh) {
    if (kind == ActTable::plain) slot = 1;
    else if (kind == ActTable::tail) slot = 2;
    else if (static_cast<CpuIsa>(isa) == CpuIsa::avx512) slot = 4;
    else if (static_cast<CpuIsa>(isa) == CpuIsa::avx2) slot = 3;
    else slot = 1;  // the scalar path's body is torch's DEFAULT build: no fma
  }
  static std::once_flag once[2][5];
  static std::vector<uint16_t> tables[2][5];
  std::call_once(once[d][slot], [&] {
    tables[d][slot] = build_table(dtype, [&](const float* in, float* out) {
      switch (slot) {
        case 0: for (int i = 0; i < 65536; ++i) out[i] = in[i] / (1.0f + std::exp(-in[i])); break;
        case 1: for (int i = 0; i < 65536; ++i) out[i] = gelu_tanh_libm(in[i], false); break;
        case 2: for (int i = 0; i < 65536; ++i) out[i] = gelu_tanh_libm(in[i], true); break;
        case 3: gelu_tanh_f32_avx2(in, out, 65536); break;
        default: gelu_tanh_f32_avx512(in, out, 65536); break;
      }
    });
  });
  return tables[d][slot].data();
}

int64_t torch_silu_fp32_step(int isa) {
  switch (static_cast<CpuIsa>(isa)) {
    case CpuIsa::avx512: return 32;
    case CpuIsa::avx2: return 16;
    default: return 0;
  }
}

int64_t torch_act_step(int isa, GluActivation a, DType t) {
  const int64_t step = torch_silu_fp32_step(isa);
  if (t == DType::float32) return step;
  return a == GluActivation::gelu_tanh ? 2 * step : 0;  // Vectorized<BFloat16/Half> holds twice the lanes
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
  if (opt.gate_layout != GateLayout::contiguous && opt.gate_layout != GateLayout::as_given)
    throw err("gate_layout", "gate_layout must be contiguous or as_given, got " +
                                 std::to_string(static_cast<int>(opt.gate_layout)));
  if (opt.activation != GluActivation::silu && opt.activation != GluActivation::gelu_tanh)
    throw err("activation", "activation must be silu or gelu_tanh, got " +
                                std::to_string(static_cast<int>(opt.activation)));
  detail::SwigluJob job;
  if (!detail::make_swiglu_job(gate, up, out, job)) return;
  job.act = opt.activation;
  const CpuIsa isa = active_cpu_isa();
  const int isa_i = static_cast<int>(isa);
  std::vector<int64_t> ranges;
  const int64_t step = detail::torch_act_step(isa_i, job.act, job.dtype);
  if (step > 0) {
    const int64_t n = job.rows * job.dim;
    ranges = detail::torch_libm_ranges(n, opt.torch_threads, step,
                                       opt.gate_layout == GateLayout::as_given ? detail::torch_silu_run(gate) : n,
                                       detail::torch_act_grain(job.act, n, opt.torch_threads));
    job.libm_ranges = ranges.data();
    job.libm_count = static_cast<int64_t>(ranges.size() / 2);
  }
  if (job.dtype != DType::float32) {
    job.act_table = detail::swiglu_act_table(job.dtype, job.act, detail::ActTable::vector, isa_i);
    job.tail_table = detail::swiglu_act_table(job.dtype, job.act, detail::ActTable::tail, isa_i);
  }
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

const char* glu_activation_name(GluActivation a) {
  switch (a) {
    case GluActivation::silu: return "silu";
    case GluActivation::gelu_tanh: return "gelu_tanh";
  }
  return "unknown";
}

void swiglu_merged(const TensorView& gate_up, const TensorView& out, const SwigluOptions& opt, Executor* executor) {
  TensorView gate, up;
  detail::split_gate_up(gate_up, out, gate, up);
  swiglu(gate, up, out, opt, executor);
}

}  // namespace opgym
