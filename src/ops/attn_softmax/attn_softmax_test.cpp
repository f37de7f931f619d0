// attn_softmax against its golden on every dtype x torch build (ISA) x layout (no mask, HF's broadcast mask, a
// full mask, strided scores, in place, 1 and 2 threads), rows of every length 1..300 and long ones, with
// adversarial values (-inf, finfo.min masks, whole rows of -inf, NaN, huge and tiny); the segmented form
// (packed and block diagonal, uneven and empty segments) against the golden and against the plain form per
// segment; the claim the golden rests on (its scalar exps = each path's vector exp); every error (nothing written).
// The golden against torch itself is the pytest's job (tests/test_attn_softmax.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cases/compare.hpp"
#include "cases/inputs.hpp"
#include "core/storage.hpp"
#include "opgym/opgym.hpp"
#include "ops/attn_softmax/kernel.hpp"

namespace opgym {
namespace {

using cases::Buffer;

const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};
const CpuIsa kIsas[] = {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512};
constexpr float kInf = std::numeric_limits<float>::infinity();

float lowest(DType t) {  // torch.finfo(t).min: what HF's masks hold
  return t == DType::bfloat16 ? bf16_to_f32(0xff7f) : t == DType::float16 ? -65504.0f : std::numeric_limits<float>::lowest();
}

// A [rows, n] buffer of dtype t from fp32 values (rounded to the dtype). Row kinds, by row index: scores
// of several spreads, a row of -inf, rows with -inf or finfo.min tails, a NaN, +inf, huge and tiny values.
Buffer scores_like(int64_t rows, int64_t n, DType t, uint64_t seed) {
  Buffer b = cases::make_buffer({rows, n}, t);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> z(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = static_cast<int>(r % 12);
    const float spread[] = {1.0f, 4.0f, 30.0f, 1e-3f};
    for (int64_t j = 0; j < n; ++j) {
      float v = z(g) * spread[kind % 4];
      if (kind == 4) v = -kInf;                                    // a whole row masked with -inf: NaN
      if (kind == 5 && j >= n / 2) v = -kInf;                      // padded with -inf
      if (kind == 6 && j % 3 == 1) v = lowest(t);                  // finfo.min in the row
      if (kind == 7 && j == n - 1) v = std::numeric_limits<float>::quiet_NaN();
      if (kind == 8 && j == n / 3) v = kInf;
      if (kind == 9) v = (j % 2 ? 1.0f : -1.0f) * (t == DType::float32 ? 3e38f : t == DType::float16 ? 6e4f : 3e38f);
      if (kind == 10) v = z(g) * 1e-30f;
      if (kind == 11) v = lowest(t);                               // a fully masked row: uniform
      store_from_f32(t, b.bytes.data(), r * n + j, v);
    }
  }
  return b;
}

// HF's masks: 0 where attended, finfo.min elsewhere: causal for [S, T] with S queries at the end of T keys,
// and every `pad`-th key padded.
Buffer hf_mask(int64_t S, int64_t T, DType t, int64_t pad) {
  Buffer b = cases::make_buffer({1, 1, S, T}, t);
  for (int64_t i = 0; i < S; ++i)
    for (int64_t j = 0; j < T; ++j) {
      const bool masked = j > T - S + i || (pad > 0 && j % pad == 0 && j > 0);
      store_from_f32(t, b.bytes.data(), i * T + j, masked ? lowest(t) : 0.0f);
    }
  return b;
}

void expect_same(const Buffer& got, const Buffer& want, const std::string& what) {
  const cases::Metrics m = cases::compare(got, want, 0, 0);  // NaN == NaN (payloads are not the contract)
  ASSERT_EQ(m.max_ulp, 0) << what << ": " << (1.0 - m.identical) * static_cast<double>(m.count) << " of " << m.count
                          << " elements differ";
}

TEST(AttnSoftmax, TheGoldensExpIsEachPathsExp) {
  // Every 127th fp32 bit pattern (34M values: both signs, subnormals, inf, NaN) through each path's exp against
  // the golden's (Sleef's scalar u10 on the vector paths, glibc's on the scalar one).
  std::vector<float> x(1 << 20), y(1 << 20);
  for (CpuIsa isa : kIsas) {
    if (!cpu_supports(isa)) continue;
    for (uint64_t base = 0; base < (1ull << 32); base += 127ull << 20) {
      for (size_t i = 0; i < x.size(); ++i) x[i] = bits_f32(static_cast<uint32_t>(base + 127ull * i));
      const int64_t n = static_cast<int64_t>(x.size());
      if (isa == CpuIsa::avx512) detail::attn_softmax_exp_avx512(x.data(), y.data(), n);
      else if (isa == CpuIsa::avx2) detail::attn_softmax_exp_avx2(x.data(), y.data(), n);
      else detail::attn_softmax_exp_scalar(x.data(), y.data(), n);
      for (size_t i = 0; i < x.size(); ++i) {
        const float w = detail::attn_softmax_golden_exp(x[i], isa);
        if (!(std::isnan(w) && std::isnan(y[i])))
          ASSERT_EQ(f32_bits(y[i]), f32_bits(w)) << isa_name(isa) << " exp(" << x[i] << ")";
      }
    }
  }
}

// The three torch builds sum in different orders: on the same rows they do not all agree (so the path
// matters), and each agrees with its own golden (the matrix below).
TEST(AttnSoftmax, TheThreeTorchBuildsDiffer) {
  if (!cpu_supports(CpuIsa::avx512)) GTEST_SKIP() << "needs AVX-512 to run all three";
  Buffer s = scores_like(48, 300, DType::float32, 5);
  std::vector<Buffer> outs;
  for (CpuIsa isa : kIsas) {
    Buffer o = cases::make_buffer({48, 300}, DType::float32);
    AttnSoftmaxOptions opt;
    opt.torch_isa = isa;
    attn_softmax(s.view(), o.view(), opt);
    outs.push_back(o);
  }
  EXPECT_NE(outs[0].bytes, outs[1].bytes);
  EXPECT_NE(outs[1].bytes, outs[2].bytes);
  EXPECT_NE(outs[0].bytes, outs[2].bytes);
}

class AttnSoftmaxMatrix : public ::testing::TestWithParam<std::tuple<DType, CpuIsa>> {};

TEST_P(AttnSoftmaxMatrix, BitExactWithTheGolden) {
  const auto [t, isa] = GetParam();
  if (!cpu_supports(isa)) GTEST_SKIP() << "this CPU lacks " << isa_name(isa);
  AttnSoftmaxOptions opt;
  opt.torch_isa = isa;
  const auto pool = make_thread_pool(2);
  // every row length 1..300 (every tail of 8, 16 and 64), then long rows
  std::vector<int64_t> lengths;
  for (int64_t n = 1; n <= 300; ++n) lengths.push_back(n);
  for (int64_t n : {511, 1024, 1025, 3072}) lengths.push_back(n);
  for (int64_t n : lengths) {
    const int64_t rows = n > 300 ? 12 : 24;
    Buffer s = scores_like(rows, n, t, static_cast<uint64_t>(n));
    Buffer got = cases::make_buffer({rows, n}, t), want = got;
    opt.scale = n % 2 ? 0.08838834764831845f : 0.11180339887498948f;  // 128 ** -0.5, 80 ** -0.5
    attn_softmax(s.view(), got.view(), opt, n % 3 ? nullptr : pool.get());
    reference::attn_softmax_basic_ops(s.view(), want.view(), opt);
    expect_same(got, want, std::string(dtype_name(t)) + " " + isa_name(isa) + " n=" + std::to_string(n));
  }
  // HF's layouts: [B, H, S, T] scores with a [B, 1, S, T] mask (broadcast over heads), a full mask, in place,
  // strided scores (a slice of a wider buffer), 1 and 2 threads.
  opt.scale = 0.08838834764831845f;
  for (int64_t S : {1, 7, 64}) {
    for (int64_t T : {S, S + 283, int64_t{300}}) {
      const int64_t H = 4;
      Buffer s = scores_like(H * S, T, t, static_cast<uint64_t>(S * 1000 + T));
      Buffer m1 = hf_mask(S, T, t, S == 7 ? 5 : 0);
      Buffer mfull = scores_like(H * S, T, t, static_cast<uint64_t>(T));
      const int64_t shape[4] = {1, H, S, T}, m_bcast[4] = {1, 1, S, T};
      const int64_t contig[4] = {H * S * T, S * T, T, 1}, m_strides[4] = {S * T, S * T, T, 1};
      for (int layout = 0; layout < 5; ++layout) {
        const TensorView sv = TensorView::strided(s.bytes.data(), t, shape, contig, 4);
        TensorView mv;
        if (layout == 1 || layout == 3) mv = TensorView::strided(m1.bytes.data(), t, m_bcast, m_strides, 4);
        if (layout == 2) mv = TensorView::strided(mfull.bytes.data(), t, shape, contig, 4);
        opt.mask = layout >= 1 && layout <= 3 ? &mv : nullptr;
        Buffer want = cases::make_buffer({1, H, S, T}, t);
        reference::attn_softmax_basic_ops(sv, want.view(), opt);
        Buffer got = cases::make_buffer({1, H, S, T}, t);
        const std::string what = std::string(dtype_name(t)) + " " + isa_name(isa) + " S=" + std::to_string(S) +
                                 " T=" + std::to_string(T) + " layout " + std::to_string(layout);
        if (layout == 3) {  // in place
          Buffer inplace = s;
          const TensorView iv = TensorView::strided(inplace.bytes.data(), t, shape, contig, 4);
          attn_softmax(iv, iv, opt, pool.get());
          inplace.shape = {1, H, S, T};
          expect_same(inplace, want, what);
        } else if (layout == 4) {  // scores as the left half of a [.., 2T] buffer
          Buffer wide = cases::make_buffer({H * S, 2 * T}, t);
          const size_t es = dtype_size(t);
          for (int64_t r = 0; r < H * S; ++r) std::memcpy(&wide.bytes[r * 2 * T * es], &s.bytes[r * T * es], T * es);
          const int64_t wstrides[4] = {H * S * 2 * T, S * 2 * T, 2 * T, 1};
          attn_softmax(TensorView::strided(wide.bytes.data(), t, shape, wstrides, 4), got.view(), opt);
          expect_same(got, want, what);
        } else {
          attn_softmax(sv, got.view(), opt, layout == 2 ? pool.get() : nullptr);
          expect_same(got, want, what);
        }
      }
      opt.mask = nullptr;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, AttnSoftmaxMatrix,
                         ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::ValuesIn(kIsas)));

// The vision windows: [H, P, W] with uneven segments (an empty one included), packed (W = the longest) and
// block diagonal (W = P): the golden's bits, each segment's rows equal to the plain form on that window's
// own [H, L, L] scores, zeros elsewhere, in place too.
TEST(AttnSoftmax, SegmentsMatchTheGoldenAndThePlainFormPerWindow) {
  const std::vector<int64_t> cu = {0, 64, 128, 128, 164, 228, 241};  // 64, 64, 0, 36, 64, 13
  const int64_t P = cu.back(), H = 3, nseg = static_cast<int64_t>(cu.size()) - 1;
  for (DType t : kDtypes) {
    for (bool diag : {false, true}) {
      const int64_t W = diag ? P : 64;
      Buffer s = scores_like(H * P, W, t, diag ? 3 : 4);
      const TensorView sv = TensorView::contiguous(s.bytes.data(), t, {H, P, W});
      AttnSoftmaxOptions opt;
      opt.scale = 0.11180339887498948f;
      Buffer got = cases::make_buffer({H, P, W}, t), want = got;
      std::memset(got.bytes.data(), 0x5a, got.bytes.size());
      attn_softmax_segments(sv, got.view(), cu.data(), nseg, diag, opt);
      reference::attn_softmax_segments_basic_ops(sv, want.view(), cu.data(), nseg, diag, opt);
      expect_same(got, want, std::string(dtype_name(t)) + (diag ? " diagonal" : " packed"));
      Buffer inplace = s;
      const TensorView iv = TensorView::contiguous(inplace.bytes.data(), t, {H, P, W});
      attn_softmax_segments(iv, iv, cu.data(), nseg, diag, opt, make_thread_pool(2).get());
      inplace.shape = {H, P, W};
      expect_same(inplace, want, std::string(dtype_name(t)) + " in place");
      const size_t es = dtype_size(t);
      for (int64_t i = 0; i < nseg; ++i) {
        const int64_t L = cu[i + 1] - cu[i], c = diag ? cu[i] : 0;
        if (L == 0) continue;
        const int64_t shape[3] = {H, L, L}, strides[3] = {P * W, W, 1};
        Buffer one = cases::make_buffer({H, L, L}, t);
        attn_softmax(TensorView::strided(s.bytes.data() + (cu[i] * W + c) * es, t, shape, strides, 3), one.view(), opt);
        for (int64_t h = 0; h < H; ++h)
          for (int64_t p = 0; p < L; ++p) {
            const unsigned char* row = &got.bytes[((h * P + cu[i] + p) * W) * es];
            ASSERT_EQ(std::memcmp(row + c * es, &one.bytes[((h * L + p) * L) * es], L * es), 0) << "segment " << i;
            for (int64_t j = 0; j < W; ++j)
              if (j < c || j >= c + L)
                for (size_t b = 0; b < es; ++b) ASSERT_EQ(row[j * es + b], 0) << "column " << j << " not zeroed";
          }
      }
    }
  }
}

// call() must throw opgym::Error naming `arg`, with `what` in its message, and write nothing.
struct AttnSoftmaxErrors : ::testing::Test {
  const DType t = DType::bfloat16;
  Buffer s = scores_like(8, 16, DType::bfloat16, 1);
  Buffer o = cases::make_buffer({8, 16}, DType::bfloat16);
  template <class F>
  void expect_error(F&& call, const std::string& arg, const std::string& what) {
    std::memset(o.bytes.data(), 0x5a, o.bytes.size());
    const auto before = std::make_tuple(s.bytes, o.bytes);
    try {
      call();
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(before == std::make_tuple(s.bytes, o.bytes)) << "written despite the error on " << arg;
  }
};

TEST_F(AttnSoftmaxErrors, ShapesDtypesMasksSegmentsAndOverlap) {
  Buffer o7 = cases::make_buffer({8, 7}, t), of = cases::make_buffer({8, 16}, DType::float32);
  expect_error([&] { attn_softmax(s.view(), o7.view()); }, "out", "scores' shape [8, 16]");
  expect_error([&] { attn_softmax(s.view(), of.view()); }, "out", "scores' dtype bfloat16");
  Buffer mf = cases::make_buffer({8, 16}, DType::float32), m3 = cases::make_buffer({8, 3}, t),
         m1 = cases::make_buffer({1, 16}, t), mrank = cases::make_buffer({16}, t);
  AttnSoftmaxOptions opt;
  TensorView mv = mf.view();
  opt.mask = &mv;
  expect_error([&] { attn_softmax(s.view(), o.view(), opt); }, "mask", "scores' dtype bfloat16");
  mv = m3.view();
  expect_error([&] { attn_softmax(s.view(), o.view(), opt); }, "mask", "broadcast to scores [8, 16]");
  mv = mrank.view();
  expect_error([&] { attn_softmax(s.view(), o.view(), opt); }, "mask", "same rank");
  mv = m1.view();  // valid: broadcast over rows
  const int64_t cu[3] = {0, 4, 8};
  expect_error([&] { attn_softmax_segments(s.view(), o.view(), cu, 2, false, opt); }, "mask", "no mask");
  opt.mask = nullptr;
  const int64_t bad_end[3] = {0, 4, 7}, bad_order[4] = {0, 5, 4, 8}, wide[3] = {0, 1, 8};
  expect_error([&] { attn_softmax_segments(s.view(), o.view(), bad_end, 2, false); }, "cu_seqlens", "from 0 to P = 8");
  expect_error([&] { attn_softmax_segments(s.view(), o.view(), bad_order, 3, false); }, "cu_seqlens", "must not decrease");
  expect_error([&] { attn_softmax_segments(s.view(), o.view(), cu, 0, false); }, "cu_seqlens", "at least 2 entries");
  expect_error([&] { attn_softmax_segments(s.view(), o.view(), nullptr, 2, false); }, "cu_seqlens", "null");
  Buffer narrow = scores_like(8, 4, t, 2), onarrow = cases::make_buffer({8, 4}, t);
  expect_error([&] { attn_softmax_segments(narrow.view(), onarrow.view(), wide, 2, false); }, "scores", "W = 4");
  expect_error([&] { attn_softmax_segments(narrow.view(), onarrow.view(), cu, 2, true); }, "scores", "block diagonal");
  Buffer flat = cases::make_buffer({16}, t), oflat = cases::make_buffer({16}, t);
  const int64_t one[2] = {0, 16};
  expect_error([&] { attn_softmax_segments(flat.view(), oflat.view(), one, 1, false); }, "scores", "rank >= 2");
  // out overlapping scores without being it
  const TensorView s1 = TensorView::contiguous(s.bytes.data(), t, {1, 16});
  const TensorView shifted = TensorView::contiguous(s.bytes.data() + 2, t, {1, 16});
  expect_error([&] { attn_softmax(s1, shifted); }, "out", "overlaps scores");
  opt.scale = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { attn_softmax(s.view(), o.view(), opt); }, "scale", "NaN");
}

}  // namespace
}  // namespace opgym
