// attn_softmax's speed against its floor, in one process: the op in place on scores [B, H, Sq, Sk] at
// Qwen2.5-VL-3B's attention shapes (text: 16 heads, HF's [1, 1, Sq, Sk] causal mask; vision: 16 heads, 64-patch
// windows packed as [16, P, 64], and a full-attention block [16, P, P] without a mask), beside a plain copy of
// the same bytes (scores read, out written; the mask's bytes are counted once per [Sq, Sk], as it stays in
// cache across the heads). Part of build/opgym_bench (--benchmark_filter=attn_softmax).
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cases/inputs.hpp"
#include "core/storage.hpp"
#include "opgym/opgym.hpp"

namespace {

using opgym::DType;

struct Shape {
  const char* name;
  int64_t heads, sq, sk;  // scores [1, heads, sq, sk]
  bool mask;
  int64_t window;  // > 0: vision windows of this many patches, packed [heads, sq, window] (sk = window)
};
const Shape kShapes[] = {
    {"text_decode_S1_T300_mask", 16, 1, 300, true, 0},
    {"text_prefill_S282_mask", 16, 282, 282, true, 0},
    {"text_prefill_S1024_mask", 16, 1024, 1024, true, 0},
    {"vision_windows_P1024_W64", 16, 1024, 64, false, 64},
    {"vision_windows_P3072_W64", 16, 3072, 64, false, 64},
    {"vision_full_P1024", 16, 1024, 1024, false, 0},
};

struct Data {
  opgym::cases::Buffer scores, mask, out;
  std::vector<int64_t> cu;
  Data(const Shape& s, DType t)
      : scores(opgym::cases::make_normal({"scores", {1, s.heads, s.sq, s.sk}, t}, 1, 0, 0.0, 3.0)),
        mask(opgym::cases::make_buffer({1, 1, s.sq, s.mask ? s.sk : 1}, t)),
        out(opgym::cases::make_buffer({1, s.heads, s.sq, s.sk}, t)) {
    if (s.mask)
      for (int64_t q = 0; q < s.sq; ++q)
        for (int64_t k = 0; k < s.sk; ++k)
          opgym::store_from_f32(t, mask.bytes.data(), q * s.sk + k, k > s.sk - s.sq + q ? -3.0e38f : 0.0f);
    if (s.window > 0)
      for (int64_t p = 0; p <= s.sq; p += s.window) cu.push_back(p);
    if (!cu.empty() && cu.back() != s.sq) cu.push_back(s.sq);
  }
  int64_t bytes() const { return static_cast<int64_t>(scores.bytes.size() + out.bytes.size()); }
};

void copy_bench(benchmark::State& st, const Shape& s, DType t, int threads) {
  Data d(s, t);
  auto pool = opgym::make_thread_pool(threads);
  const int64_t n = static_cast<int64_t>(d.scores.bytes.size()), chunk = 64 * 1024;
  for (auto _ : st) {
    pool->parallel_for((n + chunk - 1) / chunk, 1, [&](int64_t b, int64_t e) {
      std::memcpy(d.out.bytes.data() + b * chunk, d.scores.bytes.data() + b * chunk,
                  static_cast<size_t>(std::min(n, e * chunk) - b * chunk));
    });
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
}

void op_bench(benchmark::State& st, const Shape& s, DType t, int threads) {
  Data d(s, t);
  auto pool = opgym::make_thread_pool(threads);
  const opgym::TensorView sv = d.scores.view(), mv = d.mask.view(), ov = d.out.view();
  opgym::AttnSoftmaxOptions o;
  o.scale = 0.08838834764831845f;
  if (s.mask) o.mask = &mv;
  const int64_t shape3[3] = {s.heads, s.sq, s.sk};
  const opgym::TensorView s3 = opgym::TensorView::contiguous(d.scores.bytes.data(), t, shape3, 3);
  const opgym::TensorView o3 = opgym::TensorView::contiguous(d.out.bytes.data(), t, shape3, 3);
  for (auto _ : st) {
    if (s.window > 0)
      opgym::attn_softmax_segments(s3, o3, d.cu.data(), static_cast<int64_t>(d.cu.size()) - 1, false, o, pool.get());
    else
      opgym::attn_softmax(sv, ov, o, pool.get());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
}

const int kRegistered = [] {
  const int all = opgym::default_executor().max_threads();
  for (const Shape& s : kShapes) {
    for (DType t : {DType::bfloat16, DType::float32}) {
      if (t == DType::float32 && s.sq * s.sk > 300 * 1024) continue;  // fp32 at the smaller shapes only
      for (int th : all > 1 ? std::vector<int>{1, all} : std::vector<int>{1}) {
        const std::string suffix =
            std::string(s.name) + "_" + opgym::dtype_name(t) + "/threads:" + std::to_string(th);
        benchmark::RegisterBenchmark(("attn_softmax_copy/" + suffix).c_str(), copy_bench, s, t, th)->UseRealTime();
        benchmark::RegisterBenchmark(("attn_softmax/" + suffix).c_str(), op_bench, s, t, th)->UseRealTime();
      }
    }
  }
  return 0;
}();

}  // namespace
