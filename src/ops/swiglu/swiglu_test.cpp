// swiglu (silu and gelu_tanh) against its golden on every dtype x ISA x activation x layout (separate, merged gate|up, strided rows, in
// place; each with torch's silu seeing a contiguous gate or the view as given) and torch's chunk and row
// layouts, bit for bit; the claim that lets 16-bit dtypes ignore which exp
// torch used (checked on every input); the MLP against its golden; every error path (nothing written).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cases/compare.hpp"
#include "cases/inputs.hpp"
#include "core/convert.hpp"
#include "opgym/opgym.hpp"
#include "ops/swiglu/kernel.hpp"

namespace opgym {
namespace {

using cases::Buffer;
using cases::TensorSpec;

const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

TEST(Swiglu, TorchChunkTailsAreWhereTorchPutsThem) {
  using detail::torch_silu_libm_ranges;
  EXPECT_EQ(torch_silu_libm_ranges(100, 1, 32), (std::vector<int64_t>{96, 100}));
  EXPECT_EQ(torch_silu_libm_ranges(96, 4, 32), (std::vector<int64_t>{}));
  EXPECT_EQ(torch_silu_libm_ranges(32767, 8, 16), (std::vector<int64_t>{32752, 32767}));  // under the grain: one chunk
  // 70000 on 2 threads: two chunks of 35000 = 1093 * 32 + 24
  EXPECT_EQ(torch_silu_libm_ranges(70000, 2, 32), (std::vector<int64_t>{34976, 35000, 69976, 70000}));
  // 3 threads: divup(70000, 32768) = 3 chunks of 23334 (the last 23332), each 729 steps of 32 and a tail
  EXPECT_EQ(torch_silu_libm_ranges(70000, 3, 32), (std::vector<int64_t>{23328, 23334, 46662, 46668, 69996, 70000}));
  EXPECT_TRUE(torch_silu_libm_ranges(100, 1, 0).empty());
  // rows (a half of a [T, 2I] product, GateLayout::as_given): every row segment has its own tail
  EXPECT_EQ(torch_silu_libm_ranges(120, 1, 32, 40), (std::vector<int64_t>{32, 40, 72, 80, 112, 120}));
  EXPECT_EQ(torch_silu_libm_ranges(120, 1, 32, 120), torch_silu_libm_ranges(120, 1, 32));
  EXPECT_EQ(torch_silu_libm_ranges(120, 1, 32, 0), (std::vector<int64_t>{0, 120}));  // no vector body
  // 70000 in rows of 300 on 2 threads: the chunk boundary 35000 cuts row 116 into 200 + 100 elements,
  // each segment with its tail (200 = 6 * 32 + 8, 100 = 3 * 32 + 4)
  const auto r = torch_silu_libm_ranges(70000, 2, 32, 300);
  const auto has = [&](int64_t b, int64_t e) {
    for (size_t i = 0; i + 1 < r.size(); i += 2)
      if (r[i] == b && r[i + 1] == e) return true;
    return false;
  };
  EXPECT_TRUE(has(34992, 35000) && has(35096, 35100) && has(288, 300) && has(69996, 70000));
  EXPECT_EQ(r.size(), 2u * 235);  // 232 whole rows, two halves of row 116, the last row's 100
  // gelu's grain (GeluKernelImpl): numel / threads above 16384 elements. 20000 on 3 threads: grain 6666,
  // 3 chunks of 6667 (the last 6666), each 208 steps of 32 and a tail
  const int64_t grain = detail::torch_act_grain(GluActivation::gelu_tanh, 20000, 3);
  EXPECT_EQ(grain, 6666);
  EXPECT_EQ(detail::torch_libm_ranges(20000, 3, 32, 20000, grain),
            (std::vector<int64_t>{6656, 6667, 13323, 13334, 19990, 20000}));
  EXPECT_EQ(detail::torch_act_grain(GluActivation::gelu_tanh, 16384, 3), detail::kTorchGrain);  // not above 16384
  EXPECT_EQ(detail::torch_act_grain(GluActivation::silu, 20000, 3), detail::kTorchGrain);
}

TEST(Swiglu, TorchRunOfAView) {
  using detail::torch_silu_run;
  float buf[1];
  const auto view = [&](std::vector<int64_t> shape, std::vector<int64_t> strides) {
    return TensorView::strided(buf, DType::float32, shape.data(), strides.data(), static_cast<int>(shape.size()));
  };
  EXPECT_EQ(torch_silu_run(view({5, 40}, {40, 1})), 200);           // contiguous: one flat run
  EXPECT_EQ(torch_silu_run(view({5, 40}, {80, 1})), 40);            // a half of [5, 80]
  EXPECT_EQ(torch_silu_run(view({2, 5, 40}, {400, 80, 1})), 40);    // [2, 5, 80] chunked
  EXPECT_EQ(torch_silu_run(view({2, 5, 40}, {999, 40, 1})), 200);   // rows contiguous inside a batch
  EXPECT_EQ(torch_silu_run(view({1, 40}, {80, 1})), 40);            // one row: size-1 dims merge
  EXPECT_EQ(torch_silu_run(view({5, 1}, {2, 1})), 0);               // I = 1 of [5, 2]: no unit stride
  EXPECT_EQ(torch_silu_run(view({5, 40}, {0, 1})), 40);             // broadcast rows
}

// Every finite bf16 and fp16 gate: silu with Sleef's exp (the golden on the vector paths) and with
// glibc's (the golden on the scalar path) rounds to the same value, so torch's choice per element never
// shows in 16-bit outputs; and the kernels (which take the rounded silu from a table) give those bits.
TEST(Swiglu, SixteenBitSiluIsTheSameWithEitherExp) {
  for (DType t : {DType::bfloat16, DType::float16}) {
    std::vector<uint16_t> g, one;
    for (uint32_t b = 0; b < 65536; ++b) {
      const float v = t == DType::bfloat16 ? bf16_to_f32(static_cast<uint16_t>(b)) : f16_to_f32(static_cast<uint16_t>(b));
      if (std::isfinite(v)) g.push_back(static_cast<uint16_t>(b));
    }
    one.assign(g.size(), t == DType::bfloat16 ? f32_to_bf16(1.0f) : f32_to_f16(1.0f));
    const int64_t n = static_cast<int64_t>(g.size());
    const auto v = [&](std::vector<uint16_t>& b) { return TensorView::contiguous(b.data(), t, {n}); };
    std::vector<std::vector<uint16_t>> goldens;
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
      if (!cpu_supports(isa)) continue;
      set_cpu_isa(isa);
      std::vector<uint16_t> want(g.size()), got(g.size());
      reference::swiglu_basic_ops(v(g), v(one), v(want));  // glibc's exp on scalar, Sleef's otherwise
      swiglu(v(g), v(one), v(got));
      EXPECT_EQ(got, want) << dtype_name(t) << " " << isa_name(isa);
      goldens.push_back(want);
    }
    set_cpu_isa(best_cpu_isa());
    ASSERT_GE(goldens.size(), 2u) << "needs AVX2 to compare the two exps";
    for (size_t i = 1; i < goldens.size(); ++i) EXPECT_EQ(goldens[i], goldens[0]) << dtype_name(t);
  }
}

// call() must throw opgym::Error naming `arg`, with `what` in its message.
template <class F>
void expect_refusal(F&& call, const std::string& arg, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << "no error for " << arg;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), arg) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

class SwigluMatrix : public ::testing::TestWithParam<std::tuple<DType, CpuIsa, GluActivation>> {};

TEST_P(SwigluMatrix, BitExactWithTheGolden) {
  const auto [t, isa, act] = GetParam();
  if (!cpu_supports(isa)) GTEST_SKIP() << "this CPU lacks " << isa_name(isa);
  set_cpu_isa(isa);
  uint64_t seed = 11;
  for (int64_t I : {1, 7, 63, 64, 65, 200, 3420, 11008}) {
    for (int64_t T : {1, 3, 13}) {
      for (int layout = 0; layout < 8; ++layout) {  // 0 separate, 1 merged, 2 strided rows, 3 in place;
        ++seed;                                        // 4..7 the same with gate_layout as_given
        const int threads = 1 + static_cast<int>(seed % 3);
        Buffer gu = cases::make_normal(TensorSpec{"gu", {T, 2 * I}, t}, seed, 0, 0.0, 4.0);
        Buffer g = cases::make_normal(TensorSpec{"g", {T, I}, t}, seed, 1, 0.0, 4.0);
        Buffer u = cases::make_normal(TensorSpec{"u", {T, I}, t}, seed, 2);
        Buffer got = cases::make_buffer({T, I}, t), want = cases::make_buffer({T, I}, t);
        std::memset(got.bytes.data(), 0x5a, got.bytes.size());
        SwigluOptions o;
        o.torch_threads = threads;
        o.activation = act;
        o.gate_layout = layout >= 4 ? GateLayout::as_given : GateLayout::contiguous;
        TensorView gv = g.view(), uv = u.view();
        if (layout % 4 == 1 || layout % 4 == 2) detail::split_gate_up(gu.view(), got.view(), gv, uv);
        if (layout % 4 == 1) {
          swiglu_merged(gu.view(), got.view(), o);
        } else if (layout % 4 == 3) {
          got = g;
          swiglu(got.view(), uv, got.view(), o);
        } else {
          swiglu(gv, uv, got.view(), o);
        }
        reference::swiglu_basic_ops(gv, uv, want.view(), o);
        ASSERT_EQ(got.bytes, want.bytes) << "I=" << I << " T=" << T << " layout " << layout << " threads " << threads;
      }
    }
  }
  // Over torch's multi-chunk layouts: [40, 3420] = 136800 elements, 2 to 5 chunks; and the halves of
  // a [40, 2 * 3420] product with as_given (chunks cutting rows: per-segment tails).
  for (int threads : {2, 3, 5}) {
    Buffer gu = cases::make_normal(TensorSpec{"gu", {40, 2 * 3420}, t}, threads, 2, 0.0, 4.0);
    Buffer got = cases::make_buffer({40, 3420}, t), want = got;
    SwigluOptions o;
    o.torch_threads = threads;
    o.activation = act;
    o.gate_layout = GateLayout::as_given;
    TensorView gv, uv;
    detail::split_gate_up(gu.view(), got.view(), gv, uv);
    swiglu_merged(gu.view(), got.view(), o);
    reference::swiglu_basic_ops(gv, uv, want.view(), o);
    ASSERT_EQ(got.bytes, want.bytes) << "as_given, threads " << threads;
  }
  for (int threads : {2, 3, 5}) {
    Buffer g = cases::make_normal(TensorSpec{"g", {40, 3420}, t}, threads, 0, 0.0, 4.0);
    Buffer u = cases::make_normal(TensorSpec{"u", {40, 3420}, t}, threads, 1);
    Buffer got = cases::make_buffer({40, 3420}, t), want = got;
    SwigluOptions o;
    o.torch_threads = threads;
    o.activation = act;
    swiglu(g.view(), u.view(), got.view(), o);
    reference::swiglu_basic_ops(g.view(), u.view(), want.view(), o);
    ASSERT_EQ(got.bytes, want.bytes) << "threads " << threads;
  }
  set_cpu_isa(best_cpu_isa());
}

INSTANTIATE_TEST_SUITE_P(AllPaths, SwigluMatrix,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::Values(CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512),
                                            ::testing::Values(GluActivation::silu, GluActivation::gelu_tanh)));

// gelu_tanh in 16-bit: every finite input through the kernels, in a contiguous call (the vector body,
// the tail at the end) and as rows of 63 of a [n, 64] buffer (as_given: mostly torch's scalar tails),
// equals the golden on every path; and the vector body's table differs from the tail's on some input
// (measured: 4 bf16, 26 fp16 inputs), which is why 16-bit tails are placed for gelu_tanh.
TEST(Swiglu, GeluTanhSixteenBitEveryInputOnBothPaths) {
  for (DType t : {DType::bfloat16, DType::float16}) {
    std::vector<uint16_t> g;
    for (uint32_t b = 0; b < 65536; ++b) {
      const float v = t == DType::bfloat16 ? bf16_to_f32(static_cast<uint16_t>(b)) : f16_to_f32(static_cast<uint16_t>(b));
      if (std::isfinite(v)) g.push_back(static_cast<uint16_t>(b));
    }
    const int64_t rows = (static_cast<int64_t>(g.size()) + 62) / 63;
    std::vector<uint16_t> wide(rows * 64, 0), one(rows * 64, t == DType::bfloat16 ? f32_to_bf16(1.0f) : f32_to_f16(1.0f));
    for (size_t i = 0; i < g.size(); ++i) wide[(i / 63) * 64 + i % 63] = g[i];
    SwigluOptions o;
    o.activation = GluActivation::gelu_tanh;
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
      if (!cpu_supports(isa)) continue;
      set_cpu_isa(isa);
      const int64_t n = static_cast<int64_t>(g.size());
      std::vector<uint16_t> ones(g.size(), one[0]), want(g.size()), got(g.size());
      const auto flat = [&](std::vector<uint16_t>& b) { return TensorView::contiguous(b.data(), t, {n}); };
      reference::swiglu_basic_ops(flat(g), flat(ones), flat(want), o);
      swiglu(flat(g), flat(ones), flat(got), o);
      EXPECT_EQ(got, want) << dtype_name(t) << " " << isa_name(isa) << " contiguous";
      const int64_t shape[2] = {rows, 63}, strides[2] = {64, 1};
      const TensorView gv = TensorView::strided(wide.data(), t, shape, strides, 2);
      const TensorView uv = TensorView::strided(one.data(), t, shape, strides, 2);
      std::vector<uint16_t> want2(rows * 63), got2(rows * 63);
      SwigluOptions rowwise = o;
      rowwise.gate_layout = GateLayout::as_given;
      reference::swiglu_basic_ops(gv, uv, TensorView::contiguous(want2.data(), t, {rows, 63}), rowwise);
      swiglu(gv, uv, TensorView::contiguous(got2.data(), t, {rows, 63}), rowwise);
      EXPECT_EQ(got2, want2) << dtype_name(t) << " " << isa_name(isa) << " rows of 63";
      if (isa != CpuIsa::scalar) {
        const uint16_t* vec = detail::swiglu_act_table(t, GluActivation::gelu_tanh, detail::ActTable::vector,
                                                       static_cast<int>(isa));
        const uint16_t* tail = detail::swiglu_act_table(t, GluActivation::gelu_tanh, detail::ActTable::tail,
                                                        static_cast<int>(isa));
        int differ = 0;
        for (uint16_t b : g) differ += vec[b] != tail[b];
        EXPECT_GT(differ, 0) << dtype_name(t) << " " << isa_name(isa) << ": the two paths never differ";
        EXPECT_LT(differ, 100) << dtype_name(t) << " " << isa_name(isa);
      }
    }
    set_cpu_isa(best_cpu_isa());
  }
}

// fp32 gelu_tanh: on a vector path the elements of torch's scalar tail (96..99 of 100 on one thread)
// are glibc's tanhf with the fma, the vector body differs from that somewhere (Sleef's tanhf).
TEST(Swiglu, Fp32GeluTanhTailsUseGlibcTanh) {
  if (!cpu_supports(CpuIsa::avx512) && !cpu_supports(CpuIsa::avx2)) GTEST_SKIP() << "no vector path";
  if (std::string(swiglu_exp_library()) != "sleef-u10") GTEST_SKIP() << "built without Sleef: one tanh everywhere";
  set_cpu_isa(best_cpu_isa());
  SwigluOptions o;
  o.activation = GluActivation::gelu_tanh;
  std::vector<float> g(100), u(100, 1.0f), got(100);
  int differing = 0;
  for (uint32_t seed = 1; seed < 4000 && differing == 0; ++seed) {
    for (int i = 0; i < 100; ++i) g[i] = static_cast<float>((seed * 2654435761u + i * 40503u) % 20000) / 2000.0f - 5.0f;
    const auto v = [](std::vector<float>& b) { return TensorView::contiguous(b.data(), DType::float32, {100}); };
    swiglu(v(g), v(u), v(got), o);
    for (int i = 0; i < 100; ++i) {
      const float libm = detail::gelu_tanh_libm(g[i], true);
      if (i >= 96) EXPECT_EQ(got[i], libm) << "tail element " << i << " is not glibc's";
      if (i < 96 && got[i] != libm) ++differing;
    }
  }
  EXPECT_GT(differing, 0) << "no input found where the vector body's tanh differs from glibc's";
}

// The fp32 tails matter: on a vector path, the elements of torch's scalar tail (96..99 of a 100-element
// call on one thread) equal the scalar path's (glibc's exp) while the vector body differs from it on
// some element (Sleef's exp): inputs are scanned until one such element is seen, not assumed.
TEST(Swiglu, Fp32TailsUseGlibcExp) {
  if (!cpu_supports(CpuIsa::avx512) && !cpu_supports(CpuIsa::avx2)) GTEST_SKIP() << "no vector path";
  if (std::string(swiglu_exp_library()) != "sleef-u10") GTEST_SKIP() << "built without Sleef: one exp everywhere";
  set_cpu_isa(best_cpu_isa());
  // 1 row of 100: elements 96..99 are torch's scalar tail on one thread (AVX-512 step 32, AVX2 16).
  std::vector<float> g(100), u(100, 1.0f), o1(100), o2(100);
  std::vector<float> scalar_path(100);
  int differing = 0;
  for (uint32_t seed = 1; seed < 4000 && differing == 0; ++seed) {
    for (int i = 0; i < 100; ++i) g[i] = static_cast<float>((seed * 2654435761u + i * 40503u) % 20000) / 1000.0f - 10.0f;
    const auto v = [](std::vector<float>& b) { return TensorView::contiguous(b.data(), DType::float32, {100}); };
    swiglu(v(g), v(u), v(o1));
    set_cpu_isa(CpuIsa::scalar);
    swiglu(v(g), v(u), v(scalar_path));
    set_cpu_isa(best_cpu_isa());
    for (int i = 0; i < 100; ++i) {
      if (i >= 96) EXPECT_EQ(o1[i], scalar_path[i]) << "tail element " << i << " is not glibc's";
      if (i < 96 && o1[i] != scalar_path[i]) ++differing;
    }
  }
  EXPECT_GT(differing, 0) << "no input found where the vector body's exp differs from glibc's";
}

struct SwigluErrors : ::testing::Test {
  Buffer g = cases::make_normal(TensorSpec{"g", {2, 8}, DType::bfloat16}, 1, 0);
  Buffer u = cases::make_normal(TensorSpec{"u", {2, 8}, DType::bfloat16}, 1, 1);
  Buffer o = cases::make_buffer({2, 8}, DType::bfloat16);
  template <class F>
  void expect_error(F&& call, const std::string& arg, const std::string& what) {
    std::memset(o.bytes.data(), 0x5a, o.bytes.size());
    const auto before = std::make_tuple(g.bytes, u.bytes, o.bytes);
    expect_refusal(call, arg, what);
    EXPECT_TRUE(before == std::make_tuple(g.bytes, u.bytes, o.bytes)) << "written despite the error on " << arg;
  }
};

TEST_F(SwigluErrors, ShapesDtypesOverlapAndOptions) {
  Buffer u7 = cases::make_buffer({2, 7}, DType::bfloat16), uf = cases::make_buffer({2, 8}, DType::float32);
  expect_error([&] { swiglu(g.view(), u7.view(), o.view()); }, "up", "gate's shape [2, 8]");
  expect_error([&] { swiglu(g.view(), uf.view(), o.view()); }, "up", "gate's dtype bfloat16");
  expect_error([&] { swiglu(g.view(), u.view(), uf.view()); }, "out", "gate's dtype bfloat16");
  Buffer odd = cases::make_buffer({2, 7}, DType::bfloat16);
  expect_error([&] { swiglu_merged(odd.view(), o.view()); }, "gate_up", "must be even");
  expect_error([&] { swiglu_merged(g.view(), o.view()); }, "out", "[2, 4]");
  // out overlapping up without being it
  const TensorView shifted = TensorView::contiguous(u.bytes.data() + 2, DType::bfloat16, {1, 8});
  const TensorView g1 = TensorView::contiguous(g.bytes.data(), DType::bfloat16, {1, 8});
  const TensorView u1 = TensorView::contiguous(u.bytes.data(), DType::bfloat16, {1, 8});
  expect_error([&] { swiglu(g1, u1, shifted); }, "out", "overlaps up");
  SwigluOptions bad;
  bad.torch_threads = 0;
  expect_error([&] { swiglu(g.view(), u.view(), o.view(), bad); }, "torch_threads", ">= 1");
  SwigluOptions bad_layout;
  bad_layout.gate_layout = static_cast<GateLayout>(7);
  expect_error([&] { swiglu(g.view(), u.view(), o.view(), bad_layout); }, "gate_layout", "contiguous or as_given");
  SwigluOptions bad_act;
  bad_act.activation = static_cast<GluActivation>(5);
  expect_error([&] { swiglu(g.view(), u.view(), o.view(), bad_act); }, "activation", "silu or gelu_tanh");
}

// The MLP: OpenBLAS GEMMs + the fused activation against separate fp32 GEMMs + the golden activation.
TEST(SwigluMlp, MatchesTheGoldenAndMergedEqualsSeparate) {
  if (!blas_available()) GTEST_SKIP() << "built without BLAS";
  for (DType t : kDtypes) {
    for (bool bias : {false, true}) {
      const int64_t T = 5, H = 64, I = 96, Ho = 48;
      Buffer x = cases::make_normal(TensorSpec{"x", {T, H}, t}, 3, 0);
      Buffer wgu = cases::make_normal(TensorSpec{"w", {2 * I, H}, t}, 3, 1, 0.0, 0.125);
      Buffer wd = cases::make_normal(TensorSpec{"wd", {Ho, I}, t}, 3, 2, 0.0, 0.1);
      Buffer bgu = cases::make_normal(TensorSpec{"b", {2 * I}, t}, 3, 3, 0.0, 0.1);
      Buffer bd = cases::make_normal(TensorSpec{"bd", {Ho}, t}, 3, 4, 0.0, 0.1);
      const size_t es = dtype_size(t);
      const TensorView wg = TensorView::contiguous(wgu.bytes.data(), t, {I, H});
      const TensorView wu = TensorView::contiguous(wgu.bytes.data() + I * H * es, t, {I, H});
      const TensorView bg = TensorView::contiguous(bgu.bytes.data(), t, {I});
      const TensorView bu = TensorView::contiguous(bgu.bytes.data() + I * es, t, {I});
      const TensorView bdv = bd.view();
      SwigluMlpBiases b;
      if (bias) b = {&bg, &bu, &bdv};
      Buffer got = cases::make_buffer({T, Ho}, t), want = got, sep = got;
      swiglu_mlp(x.view(), wg, wu, wd.view(), got.view(), b);  // merged: one GEMM
      reference::swiglu_mlp_basic_ops(x.view(), wg, wu, wd.view(), want.view(), b);
      // separate: the same weights copied apart
      Buffer wg2 = cases::make_buffer({I, H}, t), wu2 = cases::make_buffer({I, H}, t);
      std::memcpy(wg2.bytes.data(), wgu.bytes.data(), I * H * es);
      std::memcpy(wu2.bytes.data(), wgu.bytes.data() + I * H * es, I * H * es);
      swiglu_mlp(x.view(), wg2.view(), wu2.view(), wd.view(), sep.view(), b);
      const cases::Metrics m = cases::compare(got, want, 1e-2, 1e-2);
      EXPECT_TRUE(m.allclose()) << dtype_name(t) << " bias " << bias << " max_ulp " << m.max_ulp;
      const cases::Metrics ms = cases::compare(got, sep, 0, 0);
      EXPECT_TRUE(ms.allclose()) << dtype_name(t) << ": merged differs from separate, max_ulp " << ms.max_ulp;
    }
  }
}

TEST(SwigluMlp, ShapesThatDoNotChainAreNamed) {
  const DType t = DType::bfloat16;
  Buffer x = cases::make_buffer({2, 8}, t), wg = cases::make_buffer({6, 8}, t), wu = wg, wd = cases::make_buffer({8, 6}, t);
  Buffer out = cases::make_buffer({2, 8}, t);
  const auto expect = [](auto&& call, const std::string& arg, const std::string& what) { expect_refusal(call, arg, what); };
  Buffer x9 = cases::make_buffer({2, 9}, t);
  expect([&] { swiglu_mlp(x9.view(), wg.view(), wu.view(), wd.view(), out.view()); }, "w_gate", "x's last dim 9");
  Buffer wd5 = cases::make_buffer({8, 5}, t);
  expect([&] { swiglu_mlp(x.view(), wg.view(), wu.view(), wd5.view(), out.view()); }, "w_down", "I = 6");
  Buffer wu5 = cases::make_buffer({5, 8}, t);
  expect([&] { swiglu_mlp(x.view(), wg.view(), wu5.view(), wd.view(), out.view()); }, "w_up", "w_gate's shape");
  Buffer wf = cases::make_buffer({6, 8}, DType::float32);
  expect([&] { swiglu_mlp(x.view(), wg.view(), wf.view(), wd.view(), out.view()); }, "w_up", "x's dtype bfloat16");
  Buffer b5 = cases::make_buffer({5}, t);
  const TensorView b5v = b5.view();
  SwigluMlpBiases bb;
  bb.up = &b5v;
  expect([&] { swiglu_mlp(x.view(), wg.view(), wu.view(), wd.view(), out.view(), bb); }, "b_up", "[6]");
  Buffer o7 = cases::make_buffer({2, 7}, t);
  expect([&] { swiglu_mlp(x.view(), wg.view(), wu.view(), wd.view(), o7.view()); }, "out", "[2, 8]");
}

}  // namespace
}  // namespace opgym
