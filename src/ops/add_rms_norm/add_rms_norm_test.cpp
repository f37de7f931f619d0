// add_rms_norm against its golden on every dtype pair x every ISA path x ranks x last dims x layouts
// (contiguous, row-strided, in place: out = x and sum_out = residual), both outputs bit for bit;
// the sum rounded before the norm; threads; and every error path (nothing written).
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

const int64_t kDims[] = {1, 7, 8, 63, 64, 65, 128, 129, 1280, 2048, 5125};
const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

// A view of `shape` inside a larger buffer: rows padded by 5 elements, so the rows are strided.
struct Padded {
  Buffer storage;
  TensorView view;
};
Padded make_padded(const std::vector<int64_t>& shape, DType dt, uint64_t seed, int index) {
  std::vector<int64_t> p = shape;
  p.back() += 5;
  Padded s;
  s.storage = cases::make_normal(TensorSpec{"t", p, dt}, seed, index);
  const TensorView v = s.storage.view();
  s.view = TensorView::strided(v.data, dt, shape.data(), v.strides.data(), static_cast<int>(shape.size()));
  return s;
}
// The elements of a view, row by row, as bytes (to compare strided results).
std::vector<unsigned char> bytes_of(const TensorView& v) {
  const int64_t es = dtype_size(v.dtype), dim = v.last_dim();
  std::vector<unsigned char> b;
  for (int64_t r = 0; r < v.rows(); ++r) {
    int64_t off = 0, rr = r;
    for (int d = v.rank - 2; d >= 0; --d) off += (rr % v.shape[d]) * v.strides[d], rr /= v.shape[d];
    const auto* p = static_cast<const unsigned char*>(v.data) + off * es;
    b.insert(b.end(), p, p + dim * es);
  }
  return b;
}

enum class Layout { contiguous, row_strided, in_place };

class AddRmsNormMatrix : public ::testing::TestWithParam<std::tuple<DType, DType, CpuIsa, Layout>> {};

TEST_P(AddRmsNormMatrix, BothOutputsBitExactWithTheGolden) {
  const auto [xt, wt, isa, layout] = GetParam();
  if (!cpu_supports(isa)) GTEST_SKIP() << "this CPU lacks " << isa_name(isa);
  set_cpu_isa(isa);
  const DType ot = rms_norm_out_dtype(xt, wt);
  if (layout == Layout::in_place && ot != xt) GTEST_SKIP() << "in place needs out dtype == x dtype";
  uint64_t seed = 11;
  for (int rank = 1; rank <= 3; ++rank) {
    for (const int64_t dim : kDims) {
      std::vector<int64_t> shape = rank == 1 ? std::vector<int64_t>{dim}
                                   : rank == 2 ? std::vector<int64_t>{5, dim}
                                               : std::vector<int64_t>{2, 3, dim};
      ++seed;
      Padded x = make_padded(shape, xt, seed, 0), r = make_padded(shape, xt, seed, 1);
      Buffer w = cases::make_normal(TensorSpec{"w", {dim}, wt}, seed, 2);
      Buffer x_c = cases::make_buffer(shape, xt), r_c = cases::make_buffer(shape, xt);
      // Contiguous copies of the same values (the golden's inputs).
      const auto xb = bytes_of(x.view), rbv = bytes_of(r.view);
      std::memcpy(x_c.bytes.data(), xb.data(), xb.size());
      std::memcpy(r_c.bytes.data(), rbv.data(), rbv.size());
      Buffer want = cases::make_buffer(shape, ot), want_sum = cases::make_buffer(shape, xt);
      RmsNormOptions opt;
      reference::add_rms_norm_basic_ops(x_c.view(), r_c.view(), w.view(), want.view(), want_sum.view(), opt);

      std::vector<unsigned char> got, got_sum;
      if (layout == Layout::contiguous) {
        Buffer out = cases::make_buffer(shape, ot), sum = cases::make_buffer(shape, xt);
        add_rms_norm(x_c.view(), r_c.view(), w.view(), out.view(), sum.view(), opt);
        got = bytes_of(out.view()), got_sum = bytes_of(sum.view());
      } else if (layout == Layout::row_strided) {
        Padded out = make_padded(shape, ot, 99, 0), sum = make_padded(shape, xt, 99, 1);
        add_rms_norm(x.view, r.view, w.view(), out.view, sum.view, opt);
        got = bytes_of(out.view), got_sum = bytes_of(sum.view);
      } else {  // vLLM's in-place form on strided rows: x <- normed, residual <- sum
        add_rms_norm(x.view, r.view, w.view(), x.view, r.view, opt);
        got = bytes_of(x.view), got_sum = bytes_of(r.view);
      }
      const std::string where = "rank " + std::to_string(rank) + " dim " + std::to_string(dim);
      ASSERT_EQ(got_sum, bytes_of(want_sum.view())) << "sum differs at " << where;
      ASSERT_EQ(got, bytes_of(want.view())) << "normed output differs at " << where;
    }
  }
  set_cpu_isa(best_cpu_isa());
}

INSTANTIATE_TEST_SUITE_P(
    AllPaths, AddRmsNormMatrix,
    ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::ValuesIn(kDtypes),
                       ::testing::Values(CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512),
                       ::testing::Values(Layout::contiguous, Layout::row_strided, Layout::in_place)));

// The sum is rounded to bf16 before its statistics (HF's order; vLLM #52104 lost it): with x = 1 and
// residual = 2^-9 the bf16 sum is exactly 1, so every normalized element is the same; the unrounded
// fp32 sum would make the first one differ.
TEST(AddRmsNorm, SumIsRoundedBeforeTheNorm) {
  const int64_t dim = 64;
  std::vector<uint16_t> x(dim, f32_to_bf16(1.0f)), r(dim, f32_to_bf16(0.0f)), w(dim, f32_to_bf16(1.0f));
  r[0] = f32_to_bf16(0x1p-9f);
  std::vector<uint16_t> out(dim), sum(dim);
  auto v = [&](std::vector<uint16_t>& b) { return TensorView::contiguous(b.data(), DType::bfloat16, {1, dim}); };
  const TensorView wv = TensorView::contiguous(w.data(), DType::bfloat16, {dim});
  add_rms_norm(v(x), v(r), wv, v(out), v(sum));
  EXPECT_EQ(sum[0], f32_to_bf16(1.0f));
  for (int64_t i = 1; i < dim; ++i) EXPECT_EQ(out[i], out[0]) << i;
  // And the normalized output is RMSNorm's of that sum.
  std::vector<uint16_t> direct(dim);
  rms_norm(v(sum), wv, v(direct));
  EXPECT_EQ(out, direct);
}

TEST(AddRmsNorm, ThreadsAndChunksDoNotChangeBits) {
  const std::vector<int64_t> shape{300, 2048};
  Buffer x = cases::make_normal(TensorSpec{"x", shape, DType::bfloat16}, 3, 0);
  Buffer r = cases::make_normal(TensorSpec{"r", shape, DType::bfloat16}, 3, 1);
  Buffer w = cases::make_normal(TensorSpec{"w", {2048}, DType::bfloat16}, 3, 2);
  Buffer want = cases::make_buffer(shape, DType::bfloat16), want_sum = cases::make_buffer(shape, DType::bfloat16);
  reference::add_rms_norm_basic_ops(x.view(), r.view(), w.view(), want.view(), want_sum.view());
  for (int threads : {1, 2, 4}) {
    auto pool = make_thread_pool(threads);
    Buffer out = cases::make_buffer(shape, DType::bfloat16), sum = cases::make_buffer(shape, DType::bfloat16);
    add_rms_norm(x.view(), r.view(), w.view(), out.view(), sum.view(), {}, pool.get());
    EXPECT_EQ(out.bytes, want.bytes) << threads << " threads";
    EXPECT_EQ(sum.bytes, want_sum.bytes) << threads << " threads";
  }
}

TEST(AddRmsNorm, ZeroRowsIsANoOp) {
  TensorView e = TensorView::contiguous(nullptr, DType::bfloat16, {0, 16});
  uint16_t w[16] = {};
  add_rms_norm(e, e, TensorView::contiguous(w, DType::bfloat16, {16}), e, e);
}

struct AddErrors : ::testing::Test {
  Buffer x = cases::make_normal(TensorSpec{"x", {4, 16}, DType::bfloat16}, 1, 0);
  Buffer r = cases::make_normal(TensorSpec{"r", {4, 16}, DType::bfloat16}, 1, 1);
  Buffer w = cases::make_normal(TensorSpec{"w", {16}, DType::bfloat16}, 1, 2);
  Buffer out = cases::make_buffer({4, 16}, DType::bfloat16), sum = cases::make_buffer({4, 16}, DType::bfloat16);
  void SetUp() override {
    std::memset(out.bytes.data(), 0x5a, out.bytes.size());
    std::memset(sum.bytes.data(), 0x5a, sum.bytes.size());
  }
  void expect_error(const TensorView& xv, const TensorView& rv, const TensorView& wv, const TensorView& ov,
                    const TensorView& sv, const std::string& arg, const std::string& expected) {
    const auto before = std::make_tuple(x.bytes, r.bytes, out.bytes, sum.bytes);
    try {
      add_rms_norm(xv, rv, wv, ov, sv);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    EXPECT_TRUE(before == std::make_tuple(x.bytes, r.bytes, out.bytes, sum.bytes)) << "written despite the error on " << arg;
  }
};

TEST_F(AddErrors, ResidualMustMatchXInShapeAndDtype) {
  Buffer r8 = cases::make_buffer({4, 8}, DType::bfloat16);
  expect_error(x.view(), r8.view(), w.view(), out.view(), sum.view(), "residual", "shape of x [4, 16]");
  Buffer rf = cases::make_buffer({4, 16}, DType::float32);
  expect_error(x.view(), rf.view(), w.view(), out.view(), sum.view(), "residual", "dtype bfloat16");
}
TEST_F(AddErrors, OutputsMustHaveTheirShapesAndDtypes) {
  Buffer wf = cases::make_normal(TensorSpec{"w", {16}, DType::float32}, 1, 2);
  expect_error(x.view(), r.view(), wf.view(), out.view(), sum.view(), "out", "dtype float32");
  Buffer sf = cases::make_buffer({4, 16}, DType::float32);
  expect_error(x.view(), r.view(), w.view(), out.view(), sf.view(), "sum_out", "dtype bfloat16");
  Buffer w8 = cases::make_buffer({8}, DType::bfloat16);
  expect_error(x.view(), r.view(), w8.view(), out.view(), sum.view(), "weight", "must have shape [16]");
}
TEST_F(AddErrors, InPlaceWithXAndResidualAliasedIsRefused) {
  // The in-place form (out = x, sum_out = residual) on one tensor: both outputs the same memory.
  expect_error(x.view(), x.view(), w.view(), x.view(), x.view(), "out", "overlaps sum_out");
  // residual one row into x: partial overlap of what is written with what is read.
  TensorView xv = x.view(), shifted = x.view();
  xv.shape[0] = 3, shifted.shape[0] = 3;
  shifted.data = x.bytes.data() + 2 * 16;
  expect_error(xv, shifted, w.view(), xv, shifted, "out", "overlaps sum_out");
  TensorView o3 = out.view(), r3 = r.view();
  o3.shape[0] = 3, r3.shape[0] = 3;
  expect_error(xv, r3, w.view(), o3, shifted, "sum_out", "overlaps x");
}
TEST_F(AddErrors, BadEpsAndLayouts) {
  TensorView xs = x.view();
  xs.shape[1] = 8, xs.strides[1] = 2;
  TensorView rs = TensorView::contiguous(r.bytes.data(), DType::bfloat16, {4, 8});
  Buffer w8 = cases::make_buffer({8}, DType::bfloat16);
  expect_error(xs, rs, w8.view(), TensorView::contiguous(out.bytes.data(), DType::bfloat16, {4, 8}),
               TensorView::contiguous(sum.bytes.data(), DType::bfloat16, {4, 8}), "x", "contiguous in its last dim");
  RmsNormOptions bad;
  bad.eps = -1;
  const auto before = out.bytes;
  try {
    add_rms_norm(x.view(), r.view(), w.view(), out.view(), sum.view(), bad);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "eps");
  }
  EXPECT_EQ(out.bytes, before);
}

}  // namespace
}  // namespace opgym
