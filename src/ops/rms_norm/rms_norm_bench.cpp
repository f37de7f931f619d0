// Google Benchmark for RMSNorm (filled out with the performance work).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "opgym/opgym.hpp"

static void BM_RmsNorm(benchmark::State& st) {
  const int64_t rows = st.range(0), dim = st.range(1);
  std::vector<uint16_t> x(rows * dim, 0x3f80), w(dim, 0x3f80), out(rows * dim);
  auto xv = opgym::TensorView::contiguous(x.data(), opgym::DType::bfloat16, {rows, dim});
  auto wv = opgym::TensorView::contiguous(w.data(), opgym::DType::bfloat16, {dim});
  auto ov = opgym::TensorView::contiguous(out.data(), opgym::DType::bfloat16, {rows, dim});
  for (auto _ : st) opgym::rms_norm(xv, wv, ov);
  st.SetBytesProcessed(st.iterations() * rows * dim * 4);
}
BENCHMARK(BM_RmsNorm)->Args({1, 2048})->Args({4096, 2048})->UseRealTime();
BENCHMARK_MAIN();
