// rotary against its golden on every dtype x ISA x mode x layout (HF's text [B, H, S, D] views with GQA
// k, the vision tower's [S, H, D], MRoPE's [3, ...] tables, in place) x pairing (half, interleaved,
// deinterleave; per-element and per-pair tables; rotary dims below the head dim), bit for bit; and
// every error path (nothing written).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cases/inputs.hpp"
#include "core/convert.hpp"
#include "opgym/opgym.hpp"

namespace opgym {
namespace {

using cases::Buffer;
using cases::TensorSpec;

const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

// [B, S, H, D] storage seen as [B, H, S, D] (HF's view(...).transpose(1, 2)): leading dims strided.
TensorView transposed_heads(Buffer& b, int64_t B, int64_t S, int64_t H, int64_t D) {
  const int64_t shape[4] = {B, H, S, D}, strides[4] = {S * H * D, D, H * D, 1};
  return TensorView::strided(b.bytes.data(), b.dtype, shape, strides, 4);
}

struct Layout {
  const char* name;
  std::vector<int64_t> q_store, k_store, cos_shape;
  bool transposed;  // q/k stored as [B, S, H, D] and viewed as [B, H, S, D]
  int unsqueeze_dim;
  bool mrope;
  RotaryPairs pairs = RotaryPairs::half;
  bool pair_table = false;
};

class RotaryMatrix : public ::testing::TestWithParam<std::tuple<DType, CpuIsa, int>> {};

TEST_P(RotaryMatrix, BitExactWithTheGolden) {
  const auto [xt, isa, mode_i] = GetParam();
  if (!cpu_supports(isa)) GTEST_SKIP() << "this CPU lacks " << isa_name(isa);
  set_cpu_isa(isa);
  // mode 0: hf (cos in x's dtype); 1: fp32 with fp32 cos (the vision tower); 2: fp32 with cos in x's dtype
  const RotaryMode mode = mode_i == 0 ? RotaryMode::hf : RotaryMode::fp32;
  const DType ct = mode_i == 1 ? DType::float32 : xt;
  uint64_t seed = 7;
  for (int64_t D : {2, 8, 16, 80, 128, 130, 256}) {
    const int64_t S = 5, B = 2;
    std::vector<Layout> layouts = {
        {"text", {B, S, 4, D}, {B, S, 2, D}, {B, S, D}, true, 1, false},
        {"vision", {S, 3, D}, {S, 3, D}, {S, D}, false, -2, false},
        {"broadcast batch", {B, 4, S, D}, {B, 1, S, D}, {1, S, D}, false, 1, false},
    };
    if (D == 16 || D == 128) layouts.push_back({"mrope", {1, S, 4, D}, {1, S, 2, D}, {3, 1, S, D}, true, 1, true});
    // HF's other forms: rotary dims R below D (cos R wide, or R / 2 with a per-pair table) and the
    // interleaved pairings, on the text layout (R = D / 2 and R = D; R = 2 at D = 2).
    for (int64_t R : {D / 2 - (D / 2) % 2, D}) {
      if (R < 2) continue;
      layouts.push_back({R == D ? "half R=D" : "half partial", {B, S, 4, D}, {B, S, 2, D}, {B, S, R}, true, 1,
                         false, RotaryPairs::half, false});
      layouts.push_back({R == D ? "half pair_table R=D" : "half pair_table R<D", {B, S, 4, D}, {B, S, 2, D},
                         {B, S, R / 2}, true, 1, false, RotaryPairs::half, true});
      layouts.push_back({R == D ? "interleaved R=D" : "interleaved R<D", {B, S, 4, D}, {B, S, 2, D}, {B, S, R}, true,
                         1, false, RotaryPairs::interleaved, false});
      layouts.push_back({R == D ? "interleaved pair_table R=D" : "interleaved pair_table R<D", {B, S, 4, D},
                         {B, S, 2, D}, {B, S, R / 2}, true, 1, false, RotaryPairs::interleaved, true});
      layouts.push_back({R == D ? "deinterleave R=D" : "deinterleave R<D", {B, S, 4, D}, {1, S, 1, D},
                         {1, S, R / 2}, true, 1, false, RotaryPairs::deinterleave, true});
    }
    if (D == 130) layouts.push_back({"partial, odd head dim", {S, 3, D - 1}, {S, 3, D - 1}, {S, 96}, false, -2, false});
    if (D == 256) layouts.push_back({"mrope partial", {1, S, 4, D}, {1, S, 2, D}, {3, 1, S, 128}, true, 1, true});
    for (const Layout& L : layouts) {
      for (bool in_place : {false, true}) {
        ++seed;
        Buffer qs = cases::make_normal(TensorSpec{"q", L.q_store, xt}, seed, 0);
        Buffer ks = cases::make_normal(TensorSpec{"k", L.k_store, xt}, seed, 1);
        Buffer cb = cases::make_normal(TensorSpec{"cos", L.cos_shape, ct}, seed, 2);
        Buffer sb = cases::make_normal(TensorSpec{"sin", L.cos_shape, ct}, seed, 3);
        auto view = [&](Buffer& b) {
          return L.transposed ? transposed_heads(b, b.shape[0], b.shape[1], b.shape[2], b.shape[3]) : b.view();
        };
        RotaryOptions o;
        o.mode = mode;
        o.unsqueeze_dim = L.unsqueeze_dim;
        o.pairs = L.pairs;
        o.pair_table = L.pair_table;
        if (L.mrope) o.mrope_section = D >= 128 ? std::array<int64_t, 3>{16, 24, 24} : std::array<int64_t, 3>{2, 3, 3};
        Buffer wq = qs, wk = ks;  // the golden writes into copies with the same layout
        reference::rotary_basic_ops(view(qs), view(ks), cb.view(), sb.view(), view(wq), view(wk), o);
        Buffer gq = qs, gk = ks;
        if (in_place) {
          rotary(view(gq), view(gk), cb.view(), sb.view(), view(gq), view(gk), o);
        } else {
          std::memset(gq.bytes.data(), 0x5a, gq.bytes.size());
          std::memset(gk.bytes.data(), 0x5a, gk.bytes.size());
          rotary(view(qs), view(ks), cb.view(), sb.view(), view(gq), view(gk), o);
        }
        const std::string where = std::string(L.name) + " D=" + std::to_string(D) + (in_place ? " in place" : "");
        if (!in_place) {  // the golden itself: the pass-through dims are q's own bytes
          const int64_t R = L.cos_shape.back() * (L.pair_table ? 2 : 1), Dq = L.q_store.back();
          const size_t es = dtype_size(xt);
          for (size_t row = 0; row < qs.bytes.size() / es / Dq; ++row)
            ASSERT_EQ(0, std::memcmp(wq.bytes.data() + (row * Dq + R) * es, qs.bytes.data() + (row * Dq + R) * es,
                                     (Dq - R) * es)) << where;
        }
        ASSERT_EQ(gq.bytes, wq.bytes) << "q " << where;
        ASSERT_EQ(gk.bytes, wk.bytes) << "k " << where;
      }
    }
  }
  set_cpu_isa(best_cpu_isa());
}

INSTANTIATE_TEST_SUITE_P(AllPaths, RotaryMatrix,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::Values(CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512),
                                            ::testing::Values(0, 1, 2)));

// The text path rounds each product and the sum to bf16; the vision path rounds once. Values where
// the two differ: q0 * c0 = (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 and (-q1) * s0 = 2^-8. hf: bf16(q0 c0) =
// 1 + 2^-6, plus 2^-8 is the midpoint 1 + 10 * 2^-9, which rounds to even, 1 + 2^-6; fp32: the 2^-14
// puts the sum above the midpoint, 1 + 3 * 2^-7.
TEST(Rotary, HfModeRoundsEveryStepFp32ModeOnce) {
  const uint16_t q[2] = {f32_to_bf16(1.0f + 0x1p-7f), f32_to_bf16(-1.0f)};
  const uint16_t c[2] = {f32_to_bf16(1.0f + 0x1p-7f), f32_to_bf16(1.0f)}, s[2] = {f32_to_bf16(0x1p-8f), 0};
  float got[2];
  for (int mode = 0; mode < 2; ++mode) {
    uint16_t qb[2], kb[2], out_q[2], out_k[2], cb[2], sb[2];
    std::memcpy(qb, q, 4), std::memcpy(kb, q, 4), std::memcpy(cb, c, 4), std::memcpy(sb, s, 4);
    RotaryOptions o;
    o.mode = mode == 0 ? RotaryMode::hf : RotaryMode::fp32;
    auto v = [](uint16_t* p, int r) {
      return r == 3 ? TensorView::contiguous(p, DType::bfloat16, {1, 1, 2}) : TensorView::contiguous(p, DType::bfloat16, {1, 2});
    };
    rotary(v(qb, 3), v(kb, 3), v(cb, 2), v(sb, 2), v(out_q, 3), v(out_k, 3), o);
    got[mode] = bf16_to_f32(out_q[0]);
    EXPECT_EQ(out_q[0], out_k[0]);
  }
  EXPECT_EQ(got[0], 1.0f + 0x1p-6f);
  EXPECT_EQ(got[1], 1.0f + 3 * 0x1p-7f);
}

// Where each pairing takes its elements and puts its outputs, on values small enough to be exact:
// x = 1..8 (R = 8 of D = 10, x[8], x[9] pass through), a per-pair table c = (1, 2, 3, 4), s = (10,
// 20, 30, 40): pair j's outputs are a * c_j - b * s_j and b * c_j + a * s_j.
TEST(Rotary, PairingsPlaceTheirElements) {
  const float c[4] = {1, 2, 3, 4}, s[4] = {10, 20, 30, 40};
  struct Want {
    RotaryPairs pairs;
    float out[10];
  } wants[] = {
      // halves: pairs (x1, x5), (x2, x6), (x3, x7), (x4, x8)
      {RotaryPairs::half, {1 - 50, 4 - 120, 9 - 210, 16 - 320, 5 + 10, 12 + 40, 21 + 90, 32 + 160, 9, 10}},
      // adjacent pairs (x1, x2), (x3, x4), ... back in place
      {RotaryPairs::interleaved, {1 - 20, 2 + 10, 6 - 80, 8 + 60, 15 - 180, 18 + 150, 28 - 320, 32 + 280, 9, 10}},
      // adjacent pairs in, halves out (DeepSeek-V3)
      {RotaryPairs::deinterleave, {1 - 20, 6 - 80, 15 - 180, 28 - 320, 2 + 10, 8 + 60, 18 + 150, 32 + 280, 9, 10}},
  };
  for (const Want& w : wants) {
    for (bool in_place : {false, true}) {
      float x[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, k[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, ox[10] = {}, ok[10] = {};
      RotaryOptions o;
      o.pairs = w.pairs;
      o.pair_table = true;
      o.unsqueeze_dim = 0;  // cos [4] -> [1, 4] against q [1, 10]
      auto v = [](const float* p, int64_t n) { return TensorView::contiguous(const_cast<float*>(p), DType::float32, {1, n}); };
      if (in_place)
        rotary(v(x, 10), v(k, 10), TensorView::contiguous(const_cast<float*>(c), DType::float32, {4}),
               TensorView::contiguous(const_cast<float*>(s), DType::float32, {4}), v(x, 10), v(k, 10), o);
      else
        rotary(v(x, 10), v(k, 10), TensorView::contiguous(const_cast<float*>(c), DType::float32, {4}),
               TensorView::contiguous(const_cast<float*>(s), DType::float32, {4}), v(ox, 10), v(ok, 10), o);
      const float* got = in_place ? x : ox;
      for (int i = 0; i < 10; ++i) EXPECT_EQ(got[i], w.out[i]) << rotary_pairs_name(w.pairs) << " element " << i;
      EXPECT_EQ(0, std::memcmp(got, in_place ? k : ok, sizeof(x)));
    }
  }
}

struct RotaryErrors : ::testing::Test {
  Buffer q = cases::make_normal(TensorSpec{"q", {1, 4, 3, 8}, DType::bfloat16}, 1, 0);
  Buffer k = cases::make_normal(TensorSpec{"k", {1, 2, 3, 8}, DType::bfloat16}, 1, 1);
  Buffer c = cases::make_normal(TensorSpec{"c", {1, 3, 8}, DType::bfloat16}, 1, 2);
  Buffer s = cases::make_normal(TensorSpec{"s", {1, 3, 8}, DType::bfloat16}, 1, 3);
  Buffer oq = cases::make_buffer({1, 4, 3, 8}, DType::bfloat16), ok = cases::make_buffer({1, 2, 3, 8}, DType::bfloat16);
  void expect_error(const TensorView& qv, const TensorView& kv, const TensorView& cv, const TensorView& sv,
                    const TensorView& oqv, const TensorView& okv, const std::string& arg, const std::string& what,
                    RotaryOptions o = {}) {
    std::memset(oq.bytes.data(), 0x5a, oq.bytes.size());
    const auto before = std::make_tuple(q.bytes, k.bytes, oq.bytes, ok.bytes);
    try {
      rotary(qv, kv, cv, sv, oqv, okv, o);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(before == std::make_tuple(q.bytes, k.bytes, oq.bytes, ok.bytes)) << "written despite the error on " << arg;
  }
};

TEST_F(RotaryErrors, ShapesDtypesAndSections) {
  Buffer q7 = cases::make_buffer({1, 4, 3, 7}, DType::bfloat16), k7 = cases::make_buffer({1, 2, 3, 7}, DType::bfloat16);
  Buffer c7 = cases::make_buffer({1, 3, 7}, DType::bfloat16);
  expect_error(q7.view(), k7.view(), c7.view(), c7.view(), q7.view(), k7.view(), "cos", "must be even, from 2 to");
  Buffer c10 = cases::make_buffer({1, 3, 10}, DType::bfloat16), c5 = cases::make_buffer({1, 3, 5}, DType::bfloat16);
  expect_error(q.view(), k.view(), c10.view(), c10.view(), oq.view(), ok.view(), "cos", "from 2 to q's last dim 8");
  RotaryOptions pt;
  pt.pair_table = true;
  expect_error(q.view(), k.view(), c5.view(), c5.view(), oq.view(), ok.view(), "cos", "twice it", pt);
  RotaryOptions de;
  de.pairs = RotaryPairs::deinterleave;
  expect_error(q.view(), k.view(), c.view(), s.view(), oq.view(), ok.view(), "pair_table", "deinterleave", de);
  RotaryOptions mi;
  mi.pairs = RotaryPairs::interleaved;
  mi.mrope_section = {2, 1, 1};
  Buffer c3i = cases::make_buffer({3, 1, 3, 8}, DType::bfloat16);
  expect_error(q.view(), k.view(), c3i.view(), c3i.view(), oq.view(), ok.view(), "mrope_section", "pairs half", mi);
  Buffer kf = cases::make_buffer({1, 2, 3, 8}, DType::float32);
  expect_error(q.view(), kf.view(), c.view(), s.view(), oq.view(), kf.view(), "k", "q's dtype bfloat16");
  Buffer cf = cases::make_buffer({1, 3, 8}, DType::float32);
  expect_error(q.view(), k.view(), cf.view(), cf.view(), oq.view(), ok.view(), "cos", "mode hf computes in q's dtype");
  Buffer c4 = cases::make_buffer({1, 4, 8}, DType::bfloat16);
  expect_error(q.view(), k.view(), c4.view(), c4.view(), oq.view(), ok.view(), "cos", "does not broadcast");
  expect_error(q.view(), k.view(), c.view(), c4.view(), oq.view(), ok.view(), "sin", "sin must have cos's shape");
  RotaryOptions m;
  m.mrope_section = {1, 1, 1};
  Buffer c3 = cases::make_buffer({3, 1, 3, 8}, DType::bfloat16);
  expect_error(q.view(), k.view(), c3.view(), c3.view(), oq.view(), ok.view(), "mrope_section", "sum to half", m);
  m.mrope_section = {2, 1, 1};
  expect_error(q.view(), k.view(), c.view(), s.view(), oq.view(), ok.view(), "cos", "rank 4", m);
  RotaryOptions u;
  u.unsqueeze_dim = 3;
  expect_error(q.view(), k.view(), c.view(), s.view(), oq.view(), ok.view(), "unsqueeze_dim", "before the last", u);
  Buffer oq2 = cases::make_buffer({1, 4, 3, 8}, DType::float16);
  expect_error(q.view(), k.view(), c.view(), s.view(), oq2.view(), ok.view(), "q_out", "dtype bfloat16");
}

TEST_F(RotaryErrors, AliasingIsRefused) {
  // q and k one tensor, rotated in place: q_out and k_out overlap.
  Buffer qq = cases::make_normal(TensorSpec{"q", {1, 2, 3, 8}, DType::bfloat16}, 1, 0);
  TensorView v = qq.view();
  const auto before = qq.bytes;
  try {
    rotary(v, v, c.view(), s.view(), v, v);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "k_out");
    EXPECT_NE(std::string(e.what()).find("overlaps q_out"), std::string::npos) << e.what();
  }
  EXPECT_EQ(qq.bytes, before);
  // k_out on top of q (which is read).
  expect_error(q.view(), k.view(), c.view(), s.view(), oq.view(),
               TensorView::contiguous(q.bytes.data(), DType::bfloat16, {1, 2, 3, 8}), "k_out", "overlaps q");
}

}  // namespace
}  // namespace opgym
