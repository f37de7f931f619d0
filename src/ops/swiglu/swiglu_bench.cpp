// swiglu's activation speed against its floor, in one process: swiglu_merged on gate_up [T, 2I]
// (vLLM's silu_and_mul layout, what the MLP's merged gate|up GEMM gives) at Qwen2.5-VL-3B's shapes,
// beside a plain copy of the same bytes with the same thread count. Part of build/opgym_bench (filter
// with --benchmark_filter=swiglu).
//
// The op reads 2I elements and writes I per row; the copy does the same with two memcpys per row, the
// gate half then the up half into the same out row (the second write lands in cache: memory sees 2I
// read, I written). Both report bytes_per_second over 3 * I * T elements, so copy time / op time at a
// shape and thread count is the op's % of copy bandwidth (docs/PERF.md).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "cases/inputs.hpp"
#include "opgym/opgym.hpp"

namespace {

using opgym::DType;

struct Shape {
  const char* name;
  int64_t tokens, inter;  // T rows; I (gate_up is [T, 2I], out [T, I])
  DType dtype;
};
// Qwen2.5-VL-3B: the text MLP (I 11008) at decode and two captured prefills, the vision blocks' MLP
// (I 3420) at two image sizes; fp32 at the largest text prefill (the path whose exp follows torch's
// chunk tails).
const Shape kShapes[] = {
    {"text_T1_I11008_bf16", 1, 11008, DType::bfloat16},
    {"text_T282_I11008_bf16", 282, 11008, DType::bfloat16},
    {"text_T794_I11008_bf16", 794, 11008, DType::bfloat16},
    {"vision_T1024_I3420_bf16", 1024, 3420, DType::bfloat16},
    {"vision_T3072_I3420_bf16", 3072, 3420, DType::bfloat16},
    {"text_T794_I11008_fp32", 794, 11008, DType::float32},
};

struct Data {
  opgym::cases::Buffer gate_up, out;
  explicit Data(const Shape& s)
      : gate_up(opgym::cases::make_normal({"gate_up", {s.tokens, 2 * s.inter}, s.dtype}, 1, 0)),
        out(opgym::cases::make_buffer({s.tokens, s.inter}, s.dtype)) {}
  int64_t bytes() const { return static_cast<int64_t>(gate_up.bytes.size() + out.bytes.size()); }
};

void copy_bench(benchmark::State& st, const Shape& s, int threads) {
  Data d(s);
  auto pool = opgym::make_thread_pool(threads);
  const int64_t half = static_cast<int64_t>(d.out.bytes.size()) / s.tokens;  // I elements' bytes
  const int64_t rows_per_task = std::max<int64_t>(1, 64 * 1024 / half);    // the op's ~64 KiB blocks
  const unsigned char* src = d.gate_up.bytes.data();
  unsigned char* dst = d.out.bytes.data();
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::memcpy(dst + r * half, src + 2 * r * half, half);         // gate
      std::memcpy(dst + r * half, src + (2 * r + 1) * half, half);   // up
    }
  };
  for (auto _ : st) {
    if (threads == 1 || d.bytes() < 256 * 1024) {
      rows(0, s.tokens);
    } else {
      const int64_t blocks = (s.tokens + rows_per_task - 1) / rows_per_task;
      pool->parallel_for(blocks, 1, [&](int64_t b, int64_t e) {
        rows(b * rows_per_task, std::min(s.tokens, e * rows_per_task));
      });
    }
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
}

void swiglu_bench(benchmark::State& st, const Shape& s, int threads) {
  Data d(s);
  auto pool = opgym::make_thread_pool(threads);
  const auto gu = d.gate_up.view(), ov = d.out.view();
  for (auto _ : st) {
    opgym::swiglu_merged(gu, ov, {}, pool.get());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
}

const int kRegistered = [] {
  const int all = opgym::default_executor().max_threads();
  for (const Shape& s : kShapes) {
    for (int t : {1, all}) {
      if (t == all && all == 1) continue;
      const std::string suffix = std::string(s.name) + "/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(("swiglu_copy/" + suffix).c_str(), copy_bench, s, t)->UseRealTime();
      benchmark::RegisterBenchmark(("swiglu_merged/" + suffix).c_str(), swiglu_bench, s, t)->UseRealTime();
    }
  }
  return 0;
}();

}  // namespace
