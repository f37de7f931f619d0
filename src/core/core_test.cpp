// Core pieces: dtype rounding (every path against the scalar reference, which is held to known
// torch values), instruction-set selection, tensor views, the thread pool.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cases/inputs.hpp"

#include "core/convert.hpp"
#include "ops/rms_norm/kernel.hpp"
#include "opgym/opgym.hpp"

namespace opgym {
namespace {

float f(uint32_t bits) { return bits_f32(bits); }

TEST(Convert, Bf16RoundsToNearestEvenLikeTorch) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(f(0x3f808000)), 0x3f80);  // tie, even below
  EXPECT_EQ(f32_to_bf16(f(0x3f818000)), 0x3f82);  // tie, even above
  EXPECT_EQ(f32_to_bf16(f(0x3f808001)), 0x3f81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(f(0x3f807fff)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(f(0x7f7fffff)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(f32_to_bf16(f(0x00010000)), 0x0001);  // subnormal kept
  EXPECT_EQ(f32_to_bf16(f(0x00008000)), 0x0000);  // subnormal tie to even (0)
  EXPECT_EQ(f32_to_bf16(f(0x80018000)), 0x8002);
  EXPECT_EQ(f32_to_bf16(NAN), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(f(0xffc00001)), 0x7fc0);  // any NaN stays NaN (not inf)
  EXPECT_EQ(f32_to_bf16(f(0x7f800001)), 0x7fc0);  // signalling NaN whose rounding would give inf
  EXPECT_EQ(bf16_to_f32(0x4049), f(0x40490000));
}

TEST(Convert, Fp16RoundsToNearestEvenLikeTorch) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie between max and 2^16 -> even -> inf
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);  // tie, even below
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie, even above
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // tie to even: 0
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(f32_to_f16(-0x1p-14f), 0x8400);  // smallest normal
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // rounds up into the normal range
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(NAN) & 0x7fff, 0x7e00);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x83ff), -1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every finite half survives a round trip
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

// Every vector path must round exactly as the scalar reference: ties, subnormals, overflow, random.
TEST(Convert, EveryPathRoundsLikeTheScalarReference) {
  std::vector<float> in;
  for (uint32_t hi = 0; hi < 0x10000; hi += 7)  // tie and near-tie patterns over many exponents
    for (uint32_t lo : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0x1000u, 0x0fffu, 0x2000u, 0x1fffu})
      in.push_back(f(hi << 16 | lo));
  std::mt19937 gen(7);
  for (int i = 0; i < 4096; ++i) in.push_back(f(gen()));
  for (float v : {NAN, INFINITY, -INFINITY, 65520.f, 65519.f, 0x1p-25f, 3 * 0x1p-25f, 1e-45f, -0.0f}) in.push_back(v);
  in.resize((in.size() + 63) / 64 * 64, 0.5f);
  const int64_t n = static_cast<int64_t>(in.size());
  using Fn = void (*)(DType, const float*, void*, int64_t);
  const std::pair<CpuIsa, Fn> paths[] = {{CpuIsa::scalar, detail::round_f32_scalar},
                                         {CpuIsa::avx2, detail::round_f32_avx2},
                                         {CpuIsa::avx512, detail::round_f32_avx512}};
  for (auto [isa, fn] : paths) {
    if (!cpu_supports(isa)) continue;
    std::vector<uint16_t> bf(n), hf(n);
    fn(DType::bfloat16, in.data(), bf.data(), n);
    fn(DType::float16, in.data(), hf.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const bool nan = std::isnan(in[i]);
      ASSERT_EQ(bf[i], f32_to_bf16(in[i])) << isa_name(isa) << " bf16 of 0x" << std::hex << f32_bits(in[i]);
      if (nan) ASSERT_TRUE(std::isnan(f16_to_f32(hf[i]))) << isa_name(isa);
      else ASSERT_EQ(hf[i], f32_to_f16(in[i])) << isa_name(isa) << " fp16 of 0x" << std::hex << f32_bits(in[i]);
    }
  }
}

// The AVX-512 all-bf16 layout. The exact variant must round like the scalar reference on every input;
// the native ones are used only on rows proven free of NaN and subnormal values, so their store
// (AVX512-BF16) is held to the reference on finite normal inputs and zeros, ties and overflow
// included, and their round trip on those of magnitude <= 2^100 (the guard's bound): Veltkamp's split
// zeros included, the zero-free FMA split on nonzero values only.
TEST(Convert, Avx512Bf16SplitLayoutRoundsLikeTheScalarReference) {
  if (!cpu_supports(CpuIsa::avx512)) GTEST_SKIP() << "no AVX-512";
  std::mt19937 gen(11);
  std::vector<float> in;
  for (int i = 0; i < 64 * 64; ++i) in.push_back(f(gen()));  // random bit patterns
  for (int i = 0; i < 64 * 4; ++i)  // ties and near-ties over many exponents
    in.push_back(f((gen() & 0xff7f0000u) | (i % 4 == 0 ? 0x8000u : i % 4 == 1 ? 0x7fffu : i % 4 == 2 ? 0x18000u : 0x8001u)));
  for (uint32_t hi = 0; hi < 0x10000; ++hi)  // every bf16 value with tie and near-tie low halves
    for (uint32_t lo : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) in.push_back(f(hi << 16 | lo));
  for (uint32_t e = 1; e < 255; ++e)  // the ends of every binade, where the FMA split's c changes binade
    for (uint32_t lo : {0x00001u, 0x00040u, 0x00080u, 0x00081u, 0x7fff00u, 0x7ffffeu}) {
      in.push_back(f(e << 23 | lo));
      in.push_back(f(0x80000000u | e << 23 | lo));
    }
  in.push_back(f(0x7f7fffff));  // rounds to inf
  in.push_back(-0.0f);
  in.resize((in.size() + 63) / 64 * 64, 1.0f);
  const int64_t n = static_cast<int64_t>(in.size());
  for (int variant : {0, 1, 2}) {
    const bool native = variant > 0;
    if (native && !detail::native_bf16_enabled()) continue;
    std::vector<uint16_t> stored(n);
    std::vector<float> rt(n);
    detail::round_bf16_avx512_split(variant, in.data(), stored.data(), rt.data(), n);
    int checked = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool plain = std::isfinite(in[i]) && (in[i] == 0.0f || std::fabs(in[i]) >= 0x1p-126f);
      if (native && !plain) continue;
      ++checked;
      ASSERT_EQ(stored[i], f32_to_bf16(in[i])) << "variant " << variant << " store of 0x" << std::hex << f32_bits(in[i]);
      if (native && std::fabs(in[i]) > 0x1p100f) continue;
      if (variant == 2 && in[i] == 0.0f) continue;
      ASSERT_EQ(f32_bits(rt[i]), f32_bits(bf16_to_f32(f32_to_bf16(in[i])))) << "variant " << variant << " round trip of 0x"
                                                                             << std::hex << f32_bits(in[i]);
    }
    EXPECT_GT(checked, 150000);
  }
}

TEST(Dtype, PromotionAndNames) {
  EXPECT_EQ(promote(DType::bfloat16, DType::bfloat16), DType::bfloat16);
  EXPECT_EQ(promote(DType::float32, DType::bfloat16), DType::float32);
  EXPECT_EQ(promote(DType::float16, DType::bfloat16), DType::float32);
  EXPECT_EQ(parse_dtype("bf16"), DType::bfloat16);
  EXPECT_EQ(parse_dtype("float16"), DType::float16);
  try {
    parse_dtype("int8", "weight.dtype");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "weight.dtype");
    EXPECT_NE(std::string(e.what()).find("float32, float16, bfloat16"), std::string::npos);
  }
}

TEST(CpuIsa, ForcingSelectsAndRejects) {
  const CpuIsa before = active_cpu_isa();
  EXPECT_TRUE(cpu_supports(CpuIsa::scalar));
  set_cpu_isa(CpuIsa::scalar);
  EXPECT_EQ(active_cpu_isa(), CpuIsa::scalar);
  set_cpu_isa(before);
  EXPECT_THROW(parse_isa("sse9"), Error);
  if (!cpu_supports(CpuIsa::avx512)) EXPECT_THROW(set_cpu_isa(CpuIsa::avx512), Error);
}

TEST(TensorView, ContiguousStridesAndChecks) {
  float buf[24];
  auto v = TensorView::contiguous(buf, DType::float32, {2, 3, 4});
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.rows(), 6);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.shape_str(), "[2, 3, 4]");
  EXPECT_THROW(TensorView::contiguous(buf, DType::float32, {}), Error);
  EXPECT_THROW(TensorView::contiguous(buf, DType::float32, {1, 2, 3, 4, 5, 6, 7, 8, 9}), Error);
  EXPECT_THROW(TensorView::contiguous(buf, DType::float32, {2, -1}), Error);
}

TEST(ThreadPool, CoversEveryIndexOnceAndRunsConcurrentCallers) {
  auto pool = make_thread_pool(3);
  EXPECT_EQ(pool->max_threads(), 3);
  for (int64_t n : {1, 2, 7, 100, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool->parallel_for(n, 3, [&](int64_t b, int64_t e) {
      EXPECT_LE(e - b, 3);
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  // Several callers at once: one gets the pool, the others run on their own threads.
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      for (int k = 0; k < 50; ++k) pool->parallel_for(64, 1, [&](int64_t b, int64_t e) { total += e - b; });
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 4 * 50 * 64);
  EXPECT_THROW(make_thread_pool(0), Error);
}

// Found by the fuzzers: data off its element alignment was read with typed loads (undefined
// behaviour). Every op now refuses it, naming the argument, before touching memory.
TEST(Checks, MisalignedDataIsRefusedByEveryOp) {
  alignas(64) unsigned char buf[4096] = {};
  const auto at = [&](size_t byte, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(buf + byte, DType::bfloat16, shape);
  };
  auto expect = [](auto&& call, const char* arg) {
    try {
      call();
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find("aligned to its element size"), std::string::npos) << e.what();
    }
  };
  expect([&] { rms_norm(at(1, {2, 8}), at(64, {8}), at(128, {2, 8})); }, "x");
  expect([&] { rms_norm(at(0, {2, 8}), at(65, {8}), at(128, {2, 8})); }, "weight");
  expect([&] { add_rms_norm(at(0, {2, 8}), at(193, {2, 8}), at(64, {8}), at(128, {2, 8}), at(256, {2, 8})); }, "residual");
  expect([&] { rotary(at(0, {1, 2, 8}), at(64, {1, 2, 8}), at(129, {1, 8}), at(192, {1, 8}), at(256, {1, 2, 8}),
                      at(320, {1, 2, 8})); }, "cos");
}

// Ops called from inside the pool's own tasks (a nested caller) and from several threads at once on
// one pool: no deadlock (a caller that finds the pool busy runs inline), every result the
// single-threaded one.
TEST(ThreadPool, NestedAndConcurrentCallersOfEveryOp) {
  auto pool = make_thread_pool(3);
  const int64_t rows = 200, dim = 2048;
  cases::Buffer x = cases::make_normal({"x", {rows, dim}, DType::bfloat16}, 5, 0);
  cases::Buffer r = cases::make_normal({"r", {rows, dim}, DType::bfloat16}, 5, 1);
  cases::Buffer w = cases::make_normal({"w", {dim}, DType::bfloat16}, 5, 2);
  cases::Buffer want = cases::make_buffer({rows, dim}, DType::bfloat16), want_sum = want;
  add_rms_norm(x.view(), r.view(), w.view(), want.view(), want_sum.view());
  std::atomic<int> bad{0};
  auto one = [&](Executor* ex) {
    cases::Buffer out = cases::make_buffer({rows, dim}, DType::bfloat16), sum = out;
    add_rms_norm(x.view(), r.view(), w.view(), out.view(), sum.view(), {}, ex);
    if (out.bytes != want.bytes || sum.bytes != want_sum.bytes) ++bad;
  };
  pool->parallel_for(6, 1, [&](int64_t b, int64_t e) {  // nested: each task calls the op on the same pool
    for (int64_t i = b; i < e; ++i) one(pool.get());
  });
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      for (int k = 0; k < 3; ++k) one(pool.get()), one(nullptr);  // this pool and the default one
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace opgym
