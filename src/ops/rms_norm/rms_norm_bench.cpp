// RMSNorm speed against its floor, in one process: a plain copy of the same bytes (read + write)
// with the same thread count, the fused kernel, and the unfused basic-op golden.
//
//   build/opgym_bench --benchmark_min_time=0.2 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Each benchmark reports bytes_per_second over (input bytes + output bytes); the ratio of copy time to
// kernel time at the same shape and thread count is the "% of copy bandwidth" of docs/PERF.md.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cases/inputs.hpp"
#include "opgym/opgym.hpp"

namespace {

using opgym::DType;

struct Shape {
  const char* name;
  std::vector<int64_t> dims;
  DType dtype;
};
const Shape kShapes[] = {
    {"decode_1x1x2048_bf16", {1, 1, 2048}, DType::bfloat16},
    {"head_1x64x16x128_bf16", {1, 64, 16, 128}, DType::bfloat16},
    {"vision_1036x1280_bf16", {1036, 1280}, DType::bfloat16},
    {"prefill_4096x2048_bf16", {4096, 2048}, DType::bfloat16},
    {"prefill_4096x8192_fp32", {4096, 8192}, DType::float32},
};

struct Data {
  opgym::cases::Buffer x, w, out;
  explicit Data(const Shape& s)
      : x(opgym::cases::make_normal({"x", s.dims, s.dtype}, 1, 0)),
        w(opgym::cases::make_normal({"w", {s.dims.back()}, s.dtype}, 1, 1)),
        out(opgym::cases::make_buffer(s.dims, s.dtype)) {}
  int64_t bytes() const { return static_cast<int64_t>(x.bytes.size() + out.bytes.size()); }
};

std::unique_ptr<opgym::Executor> pool_for(int threads) { return opgym::make_thread_pool(threads); }

void copy_bench(benchmark::State& st, const Shape& s, int threads) {
  Data d(s);
  auto pool = pool_for(threads);
  const int64_t n = static_cast<int64_t>(d.x.bytes.size()), chunk = 64 * 1024;
  const unsigned char* src = d.x.bytes.data();
  unsigned char* dst = d.out.bytes.data();
  for (auto _ : st) {
    if (threads == 1 || n < 256 * 1024) {
      std::memcpy(dst, src, n);
    } else {
      pool->parallel_for((n + chunk - 1) / chunk, 1, [&](int64_t b, int64_t e) {
        const int64_t lo = b * chunk, hi = std::min(n, e * chunk);
        std::memcpy(dst + lo, src + lo, hi - lo);
      });
    }
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
}

void fused_bench(benchmark::State& st, const Shape& s, int threads) {
  Data d(s);
  auto pool = pool_for(threads);
  const auto xv = d.x.view(), wv = d.w.view(), ov = d.out.view();
  for (auto _ : st) {
    opgym::rms_norm(xv, wv, ov, {}, pool.get());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
}

void golden_bench(benchmark::State& st, const Shape& s) {
  Data d(s);
  for (auto _ : st) {
    opgym::reference::rms_norm_basic_ops(d.x.view(), d.w.view(), d.out.view());
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
      benchmark::RegisterBenchmark(("copy/" + suffix).c_str(), copy_bench, s, t)->UseRealTime();
      benchmark::RegisterBenchmark(("opgym/" + suffix).c_str(), fused_bench, s, t)->UseRealTime();
    }
    benchmark::RegisterBenchmark((std::string("basic_ops_golden/") + s.name + "/threads:1").c_str(), golden_bench, s)
        ->UseRealTime();
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
