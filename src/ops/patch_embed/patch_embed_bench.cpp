// patch_embed's speed against its floors, in one process, at Qwen2.5-VL-3B's patch embedding (in 3, kernel
// (2, 14, 14) = 392 positions, 1280 channels) for P = 16, 1024 and 3072 patches (a 56x56 crop, a 448x448 and a
// 672x896 page): each form on its paths (the CPU's AMX / VDPBF16PS, and the FMA emulation), beside
//   copy        a copy of the bytes the op must move (x read, out written)
//   floor_gemm  the same product as a plain bf16 GEMM on the same AMX tiles, 32 K elements per instruction
//               (what the hardware does with this shape when the order is free; where the CPU has AMX)
// Part of build/opgym_bench (--benchmark_filter=patch_embed).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cases/inputs.hpp"
#include "opgym/opgym.hpp"
#include "ops/patch_embed/kernel.hpp"

namespace {

using opgym::DType;
using opgym::PatchEmbedForm;
constexpr int64_t kOC = 1280, kIC = 3, kNpos = 392, kK = kIC * kNpos;

struct Data {
  opgym::cases::Buffer x, w, out;
  Data(int64_t P, DType t)
      : x(opgym::cases::make_normal({"x", {P, kK}, t}, 1, 0, 0.0, 1.0)),
        w(opgym::cases::make_normal({"w", {kOC, kK}, t}, 1, 1, 0.0, 0.02)),
        out(opgym::cases::make_buffer({P, kOC}, t)) {}
  int64_t bytes() const { return static_cast<int64_t>(x.bytes.size() + out.bytes.size()); }
};

void copy_bench(benchmark::State& st, int64_t P, DType t, int threads) {
  Data d(P, t);
  auto pool = opgym::make_thread_pool(threads);
  std::vector<unsigned char> dst(d.x.bytes.size() + d.out.bytes.size());
  // dst = [x's bytes][out's bytes], copied in 64 KiB chunks of each source (none reads past its source)
  const int64_t xs = static_cast<int64_t>(d.x.bytes.size()), os = static_cast<int64_t>(d.out.bytes.size());
  const int64_t chunk = 64 * 1024, xc = (xs + chunk - 1) / chunk, oc = (os + chunk - 1) / chunk;
  for (auto _ : st) {
    pool->parallel_for(xc + oc, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const bool in_x = c < xc;
        const int64_t off = (in_x ? c : c - xc) * chunk, size = in_x ? xs : os;
        const unsigned char* src = (in_x ? d.x.bytes.data() : d.out.bytes.data()) + off;
        std::memcpy(dst.data() + (in_x ? 0 : xs) + off, src, static_cast<size_t>(std::min(chunk, size - off)));
      }
    });
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
}

void op_bench(benchmark::State& st, int64_t P, DType t, PatchEmbedForm form, bool hardware, int threads) {
  Data d(P, t);
  auto pool = opgym::make_thread_pool(threads);
  const int64_t n = opgym::patch_embed_packed_bytes(d.w.view(), kIC, form);
  std::vector<unsigned char> packed(static_cast<size_t>(n));
  opgym::patch_embed_pack(d.w.view(), kIC, form, packed.data(), n);
  opgym::PatchEmbedOptions o;
  o.hardware = hardware;
  for (auto _ : st) {
    opgym::patch_embed(d.x.view(), packed.data(), n, nullptr, d.out.view(), o, pool.get());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * d.bytes());
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * P * kOC * kK * st.iterations(), benchmark::Counter::kIsRate);
}

void floor_bench(benchmark::State& st, int64_t P, int threads) {
  const int64_t M = (P + 31) / 32 * 32, Kp = (kK + 31) / 32 * 32;
  std::vector<uint16_t> a(static_cast<size_t>(M * Kp), 0x3f80), b(static_cast<size_t>(kOC * Kp), 0x3c00);
  std::vector<float> c(static_cast<size_t>(M * kOC));
  auto pool = opgym::make_thread_pool(threads);
  for (auto _ : st) {
    pool->parallel_for(M / 32, 1, [&](int64_t m0, int64_t m1) {
      opgym::detail::patch_embed_floor_gemm_amx(a.data(), b.data(), c.data(), M, kOC, Kp, m0, m1);
    });
    benchmark::ClobberMemory();
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * P * kOC * kK * st.iterations(), benchmark::Counter::kIsRate);
}

const int kRegistered = [] {
  const int all = opgym::default_executor().max_threads();
  const bool amx = opgym::patch_embed_amx_usable(), dp = opgym::patch_embed_dot_bf16_usable();
  for (int64_t P : {16, 1024, 3072}) {
    for (int th : all > 1 ? std::vector<int>{1, all} : std::vector<int>{1}) {
      const std::string s = "P" + std::to_string(P) + "/threads:" + std::to_string(th);
      benchmark::RegisterBenchmark(("patch_embed_copy/bf16_" + s).c_str(), copy_bench, P, DType::bfloat16, th)->UseRealTime();
      if (amx) benchmark::RegisterBenchmark(("patch_embed_floor_gemm/bf16_" + s).c_str(), floor_bench, P, th)->UseRealTime();
      if (amx)
        benchmark::RegisterBenchmark(("patch_embed/amx_tile_amx_bf16_" + s).c_str(), op_bench, P, DType::bfloat16,
                                     PatchEmbedForm::amx_tile, true, th)->UseRealTime();
      if (dp)
        benchmark::RegisterBenchmark(("patch_embed/dot_pairs_vdpbf16ps_bf16_" + s).c_str(), op_bench, P,
                                     DType::bfloat16, PatchEmbedForm::dot_pairs, true, th)->UseRealTime();
      benchmark::RegisterBenchmark(("patch_embed/amx_tile_emulated_bf16_" + s).c_str(), op_bench, P, DType::bfloat16,
                                   PatchEmbedForm::amx_tile, false, th)->UseRealTime();
      benchmark::RegisterBenchmark(("patch_embed/fma_chain_f32_" + s).c_str(), op_bench, P, DType::float32,
                                   PatchEmbedForm::fma_chain, true, th)->UseRealTime();
      benchmark::RegisterBenchmark(("patch_embed/fma_chain_f16_" + s).c_str(), op_bench, P, DType::float16,
                                   PatchEmbedForm::fma_chain, true, th)->UseRealTime();
    }
  }
  return 0;
}();

}  // namespace
