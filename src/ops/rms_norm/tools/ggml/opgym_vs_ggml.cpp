// opgym's RMSNorm against ggml's CPU RMSNorm (ggml fuses rms_norm + mul on the CPU for fp32, the
// graph llama.cpp builds) and a plain copy of the same bytes, in one process. fp32 only: ggml's CPU
// rms_norm takes fp32 rows. Samples are taken round-robin (one of each implementation per round) and
// the median is reported, so a slow spell of the machine hits all three alike.
//
//   src/ops/rms_norm/tools/ggml-bench.sh GGML_SOURCE_DIR [threads...]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"
#include "opgym/opgym.hpp"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Calls per sample so that one sample lasts about `ms`.
int calibrate(const std::function<void()>& fn, double ms) {
  fn();
  const double t0 = now();
  int n = 0;
  while (now() - t0 < 0.005 || n < 3) fn(), ++n;
  return std::max(1, static_cast<int>(ms / 1e3 / ((now() - t0) / n)));
}

struct Aligned {  // a 64-byte aligned block of floats
  float* p;
  explicit Aligned(size_t bytes) : p(static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {}
  Aligned(Aligned&& o) noexcept : p(o.p) { o.p = nullptr; }
  Aligned(const Aligned&) = delete;
  ~Aligned() { std::free(p); }
};

struct Shape {
  const char* name;
  int64_t rows, dim;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts;
  for (int i = 1; i < argc; ++i) thread_counts.push_back(std::atoi(argv[i]));
  if (thread_counts.empty()) thread_counts = {1, 2};
  for (int t : thread_counts)
    if (t < 1) {
      std::fprintf(stderr, "opgym_vs_ggml: thread counts must be >= 1\n");
      return 2;
    }
  const Shape shapes[] = {
      {"decode [1, 1, 2048]", 1, 2048},          {"text prefill [1, 282, 2048]", 282, 2048},
      {"text prefill [1, 794, 2048]", 794, 2048}, {"vision [1024, 1280]", 1024, 1280},
      {"vision [3072, 1280]", 3072, 1280},        {"[4096, 2048]", 4096, 2048},
      {"[4096, 8192]", 4096, 8192},
  };
  const float eps = 1e-6f;
  const int rounds = 7;
  const double sample_ms = 20;

  std::printf("fp32 RMSNorm with weight, microseconds per call (median of %d round-robin samples); %% = copy time / time\n\n",
              rounds);
  std::printf("| shape | threads | copy | opgym | ggml | opgym %% copy | ggml %% copy | ggml / opgym | max |opgym - ggml| / |y| |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (int nt : thread_counts) {
    auto pool = opgym::make_thread_pool(nt);
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(nt);
    struct ggml_threadpool* tp = ggml_threadpool_new(&tpp);
    for (const Shape& s : shapes) {
      const int64_t n = s.rows * s.dim;
      const size_t bytes = static_cast<size_t>(n) * sizeof(float);
      // Every buffer 64-byte aligned (as torch's and ggml's backend allocators give): the tensors of a
      // no_alloc context are pointed at them, so both libraries read the same aligned rows.
      std::vector<Aligned> bufs;
      auto buffer = [&](size_t b) { bufs.emplace_back(b); return bufs.back().p; };
      float* xs = buffer(bytes);
      float* ws = buffer(s.dim * sizeof(float));
      float* out = buffer(bytes);
      float* copy_dst = buffer(bytes);
      ggml_init_params ip = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
      ggml_context* ctx = ggml_init(ip);
      ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, s.dim, s.rows);
      ggml_tensor* w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, s.dim);
      ggml_tensor* norm = ggml_rms_norm(ctx, x, eps);
      ggml_tensor* y = ggml_mul(ctx, norm, w);
      x->data = xs;
      w->data = ws;
      norm->data = buffer(bytes);  // not written when ggml fuses the multiply, but a node needs memory
      y->data = buffer(bytes);
      ggml_cgraph* gf = ggml_new_graph(ctx);
      ggml_build_forward_expand(gf, y);
      ggml_cplan plan = ggml_graph_plan(gf, nt, tp);
      std::vector<uint8_t> work(plan.work_size);
      plan.work_data = work.data();

      std::mt19937 gen(7);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (int64_t i = 0; i < n; ++i) xs[i] = nd(gen);
      for (int64_t i = 0; i < s.dim; ++i) ws[i] = 1.0f + 0.1f * nd(gen);
      for (float* b : {out, copy_dst, static_cast<float*>(y->data)}) std::memset(b, 0, bytes);  // touch the pages once
      const auto xv = opgym::TensorView::contiguous(xs, opgym::DType::float32, {s.rows, s.dim});
      const auto wv = opgym::TensorView::contiguous(ws, opgym::DType::float32, {s.dim});
      const auto ov = opgym::TensorView::contiguous(out, opgym::DType::float32, {s.rows, s.dim});
      opgym::RmsNormOptions opt;
      opt.eps = eps;

      const int64_t chunk = 16 * 1024;  // floats per copy task
      std::function<void()> fns[3] = {
          [&] {
            if (nt == 1 || n < 64 * 1024) {
              std::memcpy(copy_dst, xs, bytes);
            } else {
              pool->parallel_for((n + chunk - 1) / chunk, 1, [&](int64_t b, int64_t e) {
                const int64_t lo = b * chunk, hi = std::min(n, e * chunk);
                std::memcpy(copy_dst + lo, xs + lo, (hi - lo) * sizeof(float));
              });
            }
          },
          [&] { opgym::rms_norm(xv, wv, ov, opt, pool.get()); },
          [&] { ggml_graph_compute(gf, &plan); },
      };
      int iters[3];
      for (int k = 0; k < 3; ++k) iters[k] = calibrate(fns[k], sample_ms);
      std::vector<double> res[3];
      for (int r = 0; r < rounds; ++r)
        for (int k = 0; k < 3; ++k) {
          const double t0 = now();
          for (int i = 0; i < iters[k]; ++i) fns[k]();
          res[k].push_back((now() - t0) / iters[k]);
        }
      double med[3];
      for (int k = 0; k < 3; ++k) {
        std::sort(res[k].begin(), res[k].end());
        med[k] = res[k][rounds / 2] * 1e6;
      }
      double worst = 0;
      const auto* ys = static_cast<const float*>(y->data);
      for (int64_t i = 0; i < n; ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(out[i]) - ys[i]) / std::max(1e-30, std::fabs(static_cast<double>(ys[i]))));
      std::printf("| %s | %d | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | %.2f | %.1e |\n", s.name, nt, med[0], med[1], med[2],
                  100 * med[0] / med[1], 100 * med[0] / med[2], med[2] / med[1], worst);
      std::fflush(stdout);
      ggml_free(ctx);
    }
    ggml_threadpool_free(tp);
  }
  return 0;
}
