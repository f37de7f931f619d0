// add_rms_norm speed against its floor, in one process: a plain copy of the same bytes (x and residual
// read, out and sum written: two inputs' worth copied), the fused kernel (functional and in place),
// and the unfused golden. Part of build/opgym_bench (filter with --benchmark_filter=add_rms_norm).
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
// Qwen2.5-VL-3B's captured add+norm signatures (cases/qwen2_5_vl_3b/add_rms_norm.json) and a large one.
const Shape kShapes[] = {
    {"decode_1x1x2048_bf16", {1, 1, 2048}, DType::bfloat16},
    {"prefill_1x794x2048_bf16", {1, 794, 2048}, DType::bfloat16},
    {"vision_1024x1280_bf16", {1024, 1280}, DType::bfloat16},
    {"vision_3072x1280_bf16", {3072, 1280}, DType::bfloat16},
    {"prefill_4096x2048_bf16", {4096, 2048}, DType::bfloat16},
};

struct Data {
  opgym::cases::Buffer x, r, w, out, sum;
  explicit Data(const Shape& s)
      : x(opgym::cases::make_normal({"x", s.dims, s.dtype}, 1, 0)),
        r(opgym::cases::make_normal({"r", s.dims, s.dtype}, 1, 1)),
        w(opgym::cases::make_normal({"w", {s.dims.back()}, s.dtype}, 1, 2)),
        out(opgym::cases::make_buffer(s.dims, s.dtype)),
        sum(opgym::cases::make_buffer(s.dims, s.dtype)) {}
  int64_t bytes() const { return static_cast<int64_t>(4 * x.bytes.size()); }
};

void copy_bench(benchmark::State& st, const Shape& s, int threads) {
  Data d(s);
  auto pool = opgym::make_thread_pool(threads);
  const int64_t n = static_cast<int64_t>(d.x.bytes.size()), chunk = 64 * 1024;
  // x -> out and residual -> sum: the same bytes read and written as the op.
  auto copy = [&](const unsigned char* src, unsigned char* dst) {
    if (threads == 1 || n < 256 * 1024) return void(std::memcpy(dst, src, n));
    pool->parallel_for((n + chunk - 1) / chunk, 1, [&](int64_t b, int64_t e) {
      const int64_t lo = b * chunk, hi = std::min(n, e * chunk);
      std::memcpy(dst + lo, src + lo, hi - lo);
    });
  };
  for (auto _ : st) {
    copy(d.x.bytes.data(), d.out.bytes.data());
    copy(d.r.bytes.data(), d.sum.bytes.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
}

void fused_bench(benchmark::State& st, const Shape& s, int threads, bool in_place) {
  Data d(s);
  auto pool = opgym::make_thread_pool(threads);
  const auto xv = d.x.view(), rv = d.r.view(), wv = d.w.view(), ov = d.out.view(), sv = d.sum.view();
  for (auto _ : st) {
    if (in_place) opgym::add_rms_norm(xv, rv, wv, xv, rv, {}, pool.get());
    else opgym::add_rms_norm(xv, rv, wv, ov, sv, {}, pool.get());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
}

void golden_bench(benchmark::State& st, const Shape& s) {
  Data d(s);
  for (auto _ : st) {
    opgym::reference::add_rms_norm_basic_ops(d.x.view(), d.r.view(), d.w.view(), d.out.view(), d.sum.view());
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
      benchmark::RegisterBenchmark(("add_rms_norm_copy/" + suffix).c_str(), copy_bench, s, t)->UseRealTime();
      benchmark::RegisterBenchmark(("add_rms_norm/" + suffix).c_str(), fused_bench, s, t, false)->UseRealTime();
      benchmark::RegisterBenchmark(("add_rms_norm_inplace/" + suffix).c_str(), fused_bench, s, t, true)->UseRealTime();
    }
    benchmark::RegisterBenchmark((std::string("add_rms_norm_golden/") + s.name + "/threads:1").c_str(), golden_bench, s)
        ->UseRealTime();
  }
  return 0;
}();

}  // namespace
