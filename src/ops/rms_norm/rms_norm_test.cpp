// RMSNorm against its two goldens, on every dtype pair x every ISA path x ranks 1..5 x the listed
// last dims x contiguous / row-strided / in-place layouts, plus NaN/Inf, threads, 64-bit offsets
// and every error path.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cases/inputs.hpp"
#include "core/convert.hpp"
#include "ops/rms_norm/kernel.hpp"
#include "opgym/opgym.hpp"

namespace opgym {
namespace {

using cases::Buffer;
using cases::TensorSpec;

const int64_t kDims[] = {1, 3, 7, 8, 15, 16, 17, 31, 64, 127, 128, 129, 768, 769, 1280, 2048, 5120, 5125, 8192};
const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

// Leading dims for a rank, kept small so the whole matrix runs in seconds.
std::vector<int64_t> leading(int rank, int64_t dim) {
  const std::vector<int64_t> all = {2, 3, 1, 2};
  std::vector<int64_t> s(all.begin(), all.begin() + (rank - 1));
  if (dim >= 2048 && rank > 2) s[0] = 1;
  return s;
}

double unit_roundoff(DType t) { return t == DType::bfloat16 ? 0x1p-8 : t == DType::float16 ? 0x1p-11 : 0.0; }

enum class Layout { contiguous, row_strided, in_place };
const char* layout_name(Layout l) { return l == Layout::contiguous ? "contiguous" : l == Layout::row_strided ? "row-strided" : "in-place"; }

// A tensor of `shape` inside a larger buffer: each row padded by 3 elements and, from rank 3 on, one
// spare row per outer index, so the leading dims do not collapse to one stride.
struct Strided {
  Buffer storage;
  TensorView view;
};
Strided make_strided(const std::vector<int64_t>& shape, DType dt, uint64_t seed, int index) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> pshape = shape;
  pshape[rank - 1] += 3;
  if (rank >= 3) pshape[rank - 2] += 1;
  Strided s;
  s.storage = cases::make_normal(TensorSpec{"x", pshape, dt}, seed, index);
  TensorView padded = s.storage.view();
  s.view = TensorView::strided(padded.data, dt, shape.data(), padded.strides.data(), rank);
  return s;
}

// Copies a strided view's elements into a contiguous buffer.
Buffer gather(const TensorView& v) {
  Buffer b = cases::make_buffer(std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.rank), v.dtype);
  const int64_t rows = v.rows(), dim = v.last_dim(), es = dtype_size(v.dtype);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0, rr = r;
    for (int d = v.rank - 2; d >= 0; --d) {
      off += (rr % v.shape[d]) * v.strides[d];
      rr /= v.shape[d];
    }
    std::memcpy(b.bytes.data() + r * dim * es, static_cast<const char*>(v.data) + off * es, dim * es);
  }
  return b;
}

class RmsNormMatrix : public ::testing::TestWithParam<std::tuple<DType, DType, CpuIsa>> {};

TEST_P(RmsNormMatrix, BitExactWithBasicOpsAndBoundedAgainstFloat64) {
  const auto [xt, wt, isa] = GetParam();
  if (!cpu_supports(isa)) GTEST_SKIP() << "this CPU lacks " << isa_name(isa);
  set_cpu_isa(isa);
  const DType ot = rms_norm_out_dtype(xt, wt);
  int checked = 0;
  for (int rank = 1; rank <= 5; ++rank) {
    for (int64_t dim : kDims) {
      std::vector<int64_t> shape = leading(rank, dim);
      shape.push_back(dim);
      for (Layout layout : {Layout::contiguous, Layout::row_strided, Layout::in_place}) {
        if (layout == Layout::in_place && ot != xt) continue;  // out dtype differs: no in-place form
        for (auto [mode, order, overlap] : {std::tuple{NormMode::hf, SumOrder::automatic, -1},
                                            std::tuple{NormMode::fp32, SumOrder::automatic, -1},
                                            std::tuple{NormMode::hf, SumOrder::lanes64, -1},
                                            std::tuple{NormMode::hf, SumOrder::automatic, 1},  // every row overlapped
                                            std::tuple{NormMode::fp32, SumOrder::automatic, 1}}) {
          detail::set_overlap_mode(overlap);
          const uint64_t seed = 1000 * rank + dim;
          Strided x = make_strided(shape, xt, seed, 0);
          if (layout == Layout::contiguous) x.view = (x.storage = gather(x.view)).view();
          const Buffer x_before = gather(x.view);
          Buffer w = cases::make_normal(TensorSpec{"w", {dim}, wt}, seed, 1);
          Buffer want = cases::make_buffer(shape, ot), got_c = cases::make_buffer(shape, ot);
          RmsNormOptions opt;
          opt.eps = 1e-6;
          opt.mode = mode;
          opt.sum_order = order;
          Buffer xin = x_before;
          reference::rms_norm_basic_ops(xin.view(), w.view(), want.view(), opt);
          std::vector<double> ref(x_before.numel());
          reference::rms_norm_f64(xin.view(), w.view(), ref.data(), opt);

          TensorView out = got_c.view();
          if (layout == Layout::in_place) out = x.view;
          Strided out_strided;
          if (layout == Layout::row_strided) {
            out_strided = make_strided(shape, ot, seed, 9);
            out = out_strided.view;
          }
          rms_norm(x.view, w.view(), out, opt);
          const Buffer got = gather(out);
          detail::set_overlap_mode(-1);
          const std::string where = std::string(dtype_name(xt)) + "/" + dtype_name(wt) + " " + isa_name(isa) + " " +
                                    layout_name(layout) + " " + mode_name(mode) + " " + sum_order_name(order) +
                                    (overlap == 1 ? " overlapped " : " ") + out.shape_str();
          ASSERT_EQ(got.bytes, want.bytes) << "not bit-identical to the basic-op golden: " << where;

          // Bound against float64: the dtype roundings (h to x in hf mode, y to out), plus the fp32
          // sum (at most dim/32 sequential adds per partial in either order, then the combining
          // adds), a divide, sqrt, reciprocal and two products.
          const double fp32_err = (static_cast<double>(dim) / 32 + 48) * 0x1p-24;
          const double rel = (mode == NormMode::hf ? unit_roundoff(xt) : 0.0) + unit_roundoff(ot) + fp32_err;
          for (int64_t i = 0; i < got.numel(); ++i) {
            const double wv = w.at(i % dim);
            const double tol = rel * std::fabs(ref[i]) + 0x1p-24 * (1 + std::fabs(wv));
            ASSERT_LE(std::fabs(got.at(i) - ref[i]), tol) << where << " element " << i;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 600);
  set_cpu_isa(best_cpu_isa());
}

std::string param_name(const ::testing::TestParamInfo<RmsNormMatrix::ParamType>& info) {
  const auto [x, w, isa] = info.param;
  return std::string("x_") + dtype_name(x) + "_w_" + dtype_name(w) + "_" + isa_name(isa);
}
INSTANTIATE_TEST_SUITE_P(AllPaths, RmsNormMatrix,
                         ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::ValuesIn(kDtypes),
                                            ::testing::Values(CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512)),
                         param_name);

TEST(RmsNorm, EveryPathGivesTheSameBitsAsScalar) {
  Buffer x = cases::make_normal(TensorSpec{"x", {3, 5, 777}, DType::bfloat16}, 5, 0);
  Buffer w = cases::make_normal(TensorSpec{"w", {777}, DType::bfloat16}, 5, 1);
  std::vector<Buffer> outs;
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_supports(isa)) continue;
    set_cpu_isa(isa);
    outs.push_back(cases::make_buffer({3, 5, 777}, DType::bfloat16));
    rms_norm(x.view(), w.view(), outs.back().view());
  }
  set_cpu_isa(best_cpu_isa());
  for (const Buffer& o : outs) EXPECT_EQ(o.bytes, outs.front().bytes);
}

TEST(RmsNorm, NanAndInfPropagateAsTorchsFormula) {
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_supports(isa)) continue;
    set_cpu_isa(isa);
    for (DType dt : kDtypes) {
      Buffer x = cases::make_normal(TensorSpec{"x", {4, 100}, dt}, 3, 0);
      Buffer w = cases::make_normal(TensorSpec{"w", {100}, dt}, 3, 1);
      auto set = [&](int64_t i, float v) {
        if (dt == DType::float32) reinterpret_cast<float*>(x.bytes.data())[i] = v;
        else reinterpret_cast<uint16_t*>(x.bytes.data())[i] = dt == DType::float16 ? f32_to_f16(v) : f32_to_bf16(v);
      };
      set(5, NAN);          // row 0: all NaN
      set(100 + 7, INFINITY);  // row 1: NaN at the inf (inf * 0), zeros elsewhere
      set(200 + 99, -INFINITY);
      Buffer got = cases::make_buffer({4, 100}, dt), want = cases::make_buffer({4, 100}, dt);
      rms_norm(x.view(), w.view(), got.view());
      reference::rms_norm_basic_ops(x.view(), w.view(), want.view());
      for (int64_t i = 0; i < 400; ++i) {
        const double g = got.at(i), e = want.at(i);
        if (std::isnan(e)) ASSERT_TRUE(std::isnan(g)) << i;
        else ASSERT_EQ(g, e) << i;
      }
      for (int64_t i = 0; i < 100; ++i) EXPECT_TRUE(std::isnan(got.at(i)));
      EXPECT_TRUE(std::isnan(got.at(107)));
      EXPECT_EQ(got.at(108), 0.0);
      EXPECT_FALSE(std::isnan(got.at(350)));  // row 3 untouched
    }
  }
  set_cpu_isa(best_cpu_isa());
}

// The AVX-512 all-bf16 fast path uses AVX512-BF16 conversions only on rows it proves free of NaN
// and subnormal results. Rows built to break that proof must still match the golden bit for bit.
TEST(RmsNorm, Bf16FastPathFallsBackWhereHardwareRoundingWouldDiffer) {
  if (!cpu_supports(CpuIsa::avx512)) GTEST_SKIP() << "no AVX-512";
  set_cpu_isa(CpuIsa::avx512);
  const int64_t rows = 7, dim = 200;
  auto bits = [](float v) { return f32_to_bf16(v); };
  for (int weight_case = 0; weight_case < 4; ++weight_case) {
    Buffer x = cases::make_normal(TensorSpec{"x", {rows, dim}, DType::bfloat16}, 21, 0);
    Buffer w = cases::make_normal(TensorSpec{"w", {dim}, DType::bfloat16}, 21, 1);
    auto* xs = reinterpret_cast<uint16_t*>(x.bytes.data());
    auto* ws = reinterpret_cast<uint16_t*>(w.bytes.data());
    xs[0 * dim + 3] = bits(0x1p-131f);           // row 0: a subnormal x gives a subnormal h
    xs[1 * dim + 9] = bits(0x1p-120f);           // row 1: normal h, but h * small weight is subnormal
    ws[9] = bits(weight_case == 0 ? 0x1p-20f : 0.5f);
    xs[6 * dim + 11] = bits(0x1p-110f);           // row 6: h * small weight is a bf16 subnormal
    ws[11] = bits(weight_case == 0 ? 0x1p-20f : 0.5f);  // (2^-130: the native store would flush it)
    xs[2 * dim + 0] = 0;                          // row 2: zeros (the cheap minimum must skip them)
    xs[2 * dim + 100] = 0x8000;                   // -0 (the zero-free FMA split would give +0 here)
    for (int64_t i = 0; i < dim; ++i) xs[3 * dim + i] = 0;  // row 3: all zeros
    xs[4 * dim + 50] = bits(NAN);                 // row 4: NaN
    xs[5 * dim + 7] = bits(3e38f);                // row 5: the sum of squares overflows
    if (weight_case == 2) ws[17] = bits(INFINITY);
    if (weight_case == 3) ws[18] = bits(NAN);
    for (NormMode mode : {NormMode::hf, NormMode::fp32}) {
      RmsNormOptions opt;
      opt.mode = mode;
      Buffer want = cases::make_buffer({rows, dim}, DType::bfloat16), fast = want, exact = want;
      reference::rms_norm_basic_ops(x.view(), w.view(), want.view(), opt);
      rms_norm(x.view(), w.view(), fast.view(), opt);
      detail::set_native_bf16(false);
      rms_norm(x.view(), w.view(), exact.view(), opt);
      detail::set_native_bf16(true);
      for (int64_t i = 0; i < rows * dim; ++i) {
        const double e = want.at(i);
        if (std::isnan(e)) {
          ASSERT_TRUE(std::isnan(fast.at(i)) && std::isnan(exact.at(i))) << i;
          continue;
        }
        ASSERT_EQ(reinterpret_cast<uint16_t*>(fast.bytes.data())[i], reinterpret_cast<uint16_t*>(want.bytes.data())[i])
            << "native path, weight case " << weight_case << " " << mode_name(mode) << " row " << i / dim << " col " << i % dim;
        ASSERT_EQ(reinterpret_cast<uint16_t*>(exact.bytes.data())[i], reinterpret_cast<uint16_t*>(want.bytes.data())[i])
            << "exact path, element " << i;
      }
    }
  }
  set_cpu_isa(best_cpu_isa());
}

// The edge of that proof: an h whose fp32 value is subnormal but whose bf16 rounding is the smallest
// normal. Row of 64: 62 ones, one 1.171875 and t = 127 * 2^-133 (a subnormal bf16), so that
// r = 1/sqrt(mean) ~ 1.00513 and h = t * r ~ 0.99708 * 2^-126: fp32 subnormal, bf16(h) = 2^-126 and
// HF gives y = w * 2^-126. Taken the fast way, Veltkamp's split (inexact on subnormals) would give a
// subnormal h' and the store would flush y to 0 (checked: the test fails without the guard's check).
TEST(RmsNorm, Bf16FastPathRefusesASubnormalHThatRoundsToNormal) {
  if (!cpu_supports(CpuIsa::avx512)) GTEST_SKIP() << "no AVX-512";
  set_cpu_isa(CpuIsa::avx512);
  const int64_t rows = 8, dim = 64;  // 8 rows: the weight is pre-converted as in a real call
  Buffer x = cases::make_buffer({rows, dim}, DType::bfloat16), w = cases::make_buffer({dim}, DType::bfloat16);
  auto* xs = reinterpret_cast<uint16_t*>(x.bytes.data());
  auto* ws = reinterpret_cast<uint16_t*>(w.bytes.data());
  for (int64_t i = 0; i < dim; ++i) ws[i] = f32_to_bf16(1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) xs[r * dim + i] = f32_to_bf16(1.0f);
    xs[r * dim + 5] = f32_to_bf16(1.171875f);
    xs[r * dim + 40] = 127;  // 127 * 2^-133
  }
  Buffer want = cases::make_buffer({rows, dim}, DType::bfloat16), got = want;
  reference::rms_norm_basic_ops(x.view(), w.view(), want.view());
  ASSERT_EQ(reinterpret_cast<uint16_t*>(want.bytes.data())[40], 0x0080) << "the case must hit bf16(h) = 2^-126";
  rms_norm(x.view(), w.view(), got.view());
  EXPECT_EQ(got.bytes, want.bytes);
  set_cpu_isa(best_cpu_isa());
}

// The vector paths add bf16 and fp16 squares by FMA, which equals torch's mul-then-add only where x^2
// is exact in fp32. A bf16 |x| < 2^-63 has a subnormal, rounded square, so such a row must be summed
// again the plain way. In units of 2^-149, row r holds x1 = (133 + 2r) 2^-80 in its first 32 elements
// (x1^2 ~ 8.6-9.4, rounded to A = 9) and x2 = k 2^-75, k = 9 + 2r, in the others (x2^2 = k^2/2, a tie).
// Each lane sums A + fl(x2^2) = A + B (the tie rounded alone, to even) the plain way, but
// fma(x2, x2, A) = A + B + 1; with A + B = 2q + 1, q even, the mean over 64 (eps = 0) rounds to q the
// plain way and is q + 1 fused, so r and the outputs differ. (Checked: without the re-summing this
// test fails.) fp16 squares are always exact: tiny random rows.
TEST(RmsNorm, FusedSquaresKeepTorchsRoundingForTinyValues) {
  const int64_t rows = 4, dim = 64;
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_supports(isa)) continue;
    set_cpu_isa(isa);
    for (DType dt : {DType::bfloat16, DType::float16}) {
      Buffer x = cases::make_normal(TensorSpec{"x", {rows, dim}, dt}, 31, 0);
      Buffer w = cases::make_normal(TensorSpec{"w", {dim}, dt}, 31, 1);
      auto* xs = reinterpret_cast<uint16_t*>(x.bytes.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < dim; ++i) {
          const float sign = (i + r) % 3 == 0 ? -1.0f : 1.0f;
          if (dt == DType::bfloat16)
            xs[r * dim + i] = f32_to_bf16(sign * static_cast<float>(i < 32 ? (133 + 2 * r) * 0x1p-80 : (9 + 2 * r) * 0x1p-75));
          else
            xs[r * dim + i] = f32_to_f16(sign * (1.0f + static_cast<float>((i * 7 + r) % 97) / 64.0f) * 0x1p-14f);
        }
      RmsNormOptions opt;
      opt.eps = 0.0;
      Buffer want = cases::make_buffer({rows, dim}, dt), got = want;
      reference::rms_norm_basic_ops(x.view(), w.view(), want.view(), opt);
      rms_norm(x.view(), w.view(), got.view(), opt);
      EXPECT_EQ(got.bytes, want.bytes) << isa_name(isa) << " " << dtype_name(dt);
    }
  }
  set_cpu_isa(best_cpu_isa());
}

TEST(RmsNorm, WeightOffsetIsOnePlusWeight) {
  Buffer x = cases::make_normal(TensorSpec{"x", {2, 96}, DType::float32}, 1, 0);
  Buffer w = cases::make_normal(TensorSpec{"w", {96}, DType::float32}, 1, 1);
  Buffer w1 = w;
  for (int i = 0; i < 96; ++i) reinterpret_cast<float*>(w1.bytes.data())[i] += 1.0f;
  Buffer a = cases::make_buffer({2, 96}, DType::float32), b = a;
  RmsNormOptions off;
  off.weight_offset = true;
  rms_norm(x.view(), w.view(), a.view(), off);
  rms_norm(x.view(), w1.view(), b.view());
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST(RmsNorm, ThreadCountDoesNotChangeBits) {
  Buffer x = cases::make_normal(TensorSpec{"x", {1, 700, 2048}, DType::bfloat16}, 11, 0);
  Buffer w = cases::make_normal(TensorSpec{"w", {2048}, DType::bfloat16}, 11, 1);
  Buffer serial = cases::make_buffer({1, 700, 2048}, DType::bfloat16);
  rms_norm(x.view(), w.view(), serial.view(), {}, &serial_executor());
  for (int threads : {2, 3, 5}) {
    auto pool = make_thread_pool(threads);
    EXPECT_GT(plan_rms_norm(x.view(), DType::bfloat16, threads).threads, 1);
    Buffer par = cases::make_buffer({1, 700, 2048}, DType::bfloat16);
    rms_norm(x.view(), w.view(), par.view(), {}, pool.get());
    EXPECT_EQ(par.bytes, serial.bytes) << threads << " threads";
  }
}

// Outputs of 32 MiB and more go out through non-temporal stores when a row is 64-byte aligned: the
// bits must equal those of the ordinary stores (the same output at a misaligned address).
TEST(RmsNorm, StreamingStoresGiveTheSameBits) {
  for (DType dt : {DType::float32, DType::bfloat16}) {
    const int64_t rows = dt == DType::float32 ? 1024 : 2048, dim = 8192;
    Buffer x = cases::make_normal(TensorSpec{"x", {rows, dim}, dt}, 8, 0);
    Buffer w = cases::make_normal(TensorSpec{"w", {dim}, dt}, 8, 1);
    const size_t bytes = static_cast<size_t>(rows * dim) * dtype_size(dt);
    void* raw = nullptr;
    ASSERT_EQ(posix_memalign(&raw, 64, bytes + 64), 0);
    auto* base = static_cast<unsigned char*>(raw);
    auto aligned = TensorView::contiguous(base, dt, {rows, dim});
    Buffer plain = cases::make_buffer({rows, dim}, dt);
    auto misaligned = TensorView::contiguous(base + 32, dt, {rows, dim});  // disjoint use, one after the other
    rms_norm(x.view(), w.view(), misaligned);
    std::memcpy(plain.bytes.data(), base + 32, bytes);
    rms_norm(x.view(), w.view(), aligned);
    EXPECT_EQ(std::memcmp(base, plain.bytes.data(), bytes), 0) << dtype_name(dt);
    std::free(raw);
  }
}

TEST(RmsNorm, ConcurrentCallersGetTheirOwnResults) {
  std::vector<Buffer> xs, outs, wants;
  Buffer w = cases::make_normal(TensorSpec{"w", {2048}, DType::bfloat16}, 2, 1);
  for (int t = 0; t < 4; ++t) {
    xs.push_back(cases::make_normal(TensorSpec{"x", {64 + 32 * t, 2048}, DType::bfloat16}, 100 + t, 0));
    outs.push_back(cases::make_buffer(xs.back().shape, DType::bfloat16));
    wants.push_back(outs.back());
    reference::rms_norm_basic_ops(xs[t].view(), w.view(), wants[t].view());
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 20; ++k) rms_norm(xs[t].view(), w.view(), outs[t].view());
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(outs[t].bytes, wants[t].bytes) << t;
}

TEST(RmsNorm, ZeroRowsIsANoOp) {
  uint16_t w[8] = {};
  const int64_t shape[] = {0, 8};
  auto x = TensorView::contiguous(nullptr, DType::bfloat16, shape, 2);
  EXPECT_NO_THROW(rms_norm(x, TensorView::contiguous(w, DType::bfloat16, {8}), x));
  EXPECT_EQ(plan_rms_norm(x, DType::bfloat16).blocks, 0);
}

// Offsets beyond 2^31 elements: two rows 2^31 + 64 elements apart in a sparse mapping.
TEST(RmsNorm, SixtyFourBitOffsets) {
  const int64_t dim = 64, stride = (int64_t{1} << 31) + 64;
  const size_t bytes = static_cast<size_t>((stride + dim) * 2);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) GTEST_SKIP() << "cannot map 4 GiB of address space";
  auto* base = static_cast<uint16_t*>(mem);
  for (int64_t i = 0; i < dim; ++i) base[i] = base[stride + i] = f32_to_bf16(static_cast<float>(i % 7) - 3.0f);
  Buffer w = cases::make_normal(TensorSpec{"w", {dim}, DType::bfloat16}, 4, 1);
  const int64_t shape[] = {2, dim}, strides[] = {stride, 1};
  auto x = TensorView::strided(base, DType::bfloat16, shape, strides, 2);
  Buffer out = cases::make_buffer({2, dim}, DType::bfloat16);
  rms_norm(x, w.view(), out.view());
  EXPECT_EQ(std::memcmp(out.bytes.data(), out.bytes.data() + 2 * dim, 2 * dim), 0);
  rms_norm(x, w.view(), x);  // in place, writing past 4 GiB
  EXPECT_EQ(std::memcmp(base + stride, out.bytes.data(), 2 * dim), 0);
  const int64_t big[] = {int64_t{3} << 30, 2};  // 2^31.6 elements: the plan counts them in 64 bits
  const auto plan = plan_rms_norm(TensorView::contiguous(nullptr, DType::float32, big, 2), DType::float32, 2);
  EXPECT_EQ(plan.rows, int64_t{3} << 30);
  munmap(mem, bytes);
}

TEST(RmsNorm, PlanFollowsTheShape) {
  const int64_t decode[] = {1, 1, 2048}, prefill[] = {1, 4096, 2048}, head[] = {1, 512, 16, 128}, odd[] = {5125};
  auto plan = [](const int64_t* s, int r, int threads) {
    return plan_rms_norm(TensorView::contiguous(nullptr, DType::bfloat16, s, r), DType::bfloat16, threads);
  };
  EXPECT_EQ(plan(decode, 3, 8).threads, 1);
  EXPECT_EQ(plan(decode, 3, 8).blocks, 1);
  EXPECT_EQ(plan(prefill, 3, 8).threads, 8);
  EXPECT_EQ(plan(prefill, 3, 8).rows, 4096);
  EXPECT_EQ(plan(head, 4, 2).rows, 512 * 16);
  EXPECT_EQ(plan(head, 4, 2).dim, 128);
  EXPECT_EQ(plan(odd, 1, 2).vector_body, 5120);
  EXPECT_EQ(plan(odd, 1, 2).tail, 5);
  EXPECT_NE(plan(prefill, 3, 2).describe().find("row blocks"), std::string::npos);
  // Row blocks end on a 64-byte line of the (contiguous) output, whatever the row length, so no two
  // threads write one line: 1500 bf16 = 3000 bytes (gcd 8 with 64: blocks of 8k rows), 1001 fp32
  // (gcd 4: 16k rows), and with the promotion to fp32 the output row, not x's, decides.
  for (const auto& [d, xd, wd] : {std::tuple{int64_t{1500}, DType::bfloat16, DType::bfloat16},
                                  std::tuple{int64_t{1001}, DType::float32, DType::float32},
                                  std::tuple{int64_t{999}, DType::bfloat16, DType::float32},
                                  std::tuple{int64_t{2048}, DType::bfloat16, DType::bfloat16}}) {
    const int64_t shape[] = {4096, d};
    const auto p = plan_rms_norm(TensorView::contiguous(nullptr, xd, shape, 2), wd, 2);
    const int64_t out_row = d * static_cast<int64_t>(dtype_size(rms_norm_out_dtype(xd, wd)));
    EXPECT_GT(p.blocks, 1) << d;
    EXPECT_EQ(p.row_block * out_row % 64, 0) << d << " rows " << p.row_block;
    EXPECT_EQ(p.blocks, (4096 + p.row_block - 1) / p.row_block) << d;
  }
  // Long odd rows keep ~64 KiB blocks rather than blocks of 32 rows (6.4 MB here) that would idle threads.
  const int64_t long_odd[] = {64, 100001};
  EXPECT_EQ(plan_rms_norm(TensorView::contiguous(nullptr, DType::bfloat16, long_odd, 2), DType::bfloat16, 8).blocks, 64);
}

// ---- errors: named argument, expected value, nothing written ----------------------------------

struct ErrorFixture : ::testing::Test {
  Buffer x = cases::make_normal(TensorSpec{"x", {4, 16}, DType::bfloat16}, 1, 0);
  Buffer w = cases::make_normal(TensorSpec{"w", {16}, DType::bfloat16}, 1, 1);
  Buffer out = cases::make_buffer({4, 16}, DType::bfloat16);
  void SetUp() override { std::memset(out.bytes.data(), 0x5a, out.bytes.size()); }
  void expect_error(const TensorView& xv, const TensorView& wv, const TensorView& ov, const std::string& arg,
                    const std::string& expected, RmsNormOptions opt = {}) {
    const auto before = out.bytes;
    try {
      rms_norm(xv, wv, ov, opt);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    EXPECT_EQ(out.bytes, before) << "written despite the error on " << arg;
  }
};

TEST_F(ErrorFixture, UnsupportedDtype) {
  TensorView bad = x.view();
  bad.dtype = static_cast<DType>(7);
  expect_error(bad, w.view(), out.view(), "x", "float32, float16 or bfloat16");
}
TEST_F(ErrorFixture, WeightLengthMustBeLastDim) {
  Buffer w8 = cases::make_normal(TensorSpec{"w", {8}, DType::bfloat16}, 1, 1);
  expect_error(x.view(), w8.view(), out.view(), "weight", "must have shape [16]");
  Buffer w2 = cases::make_normal(TensorSpec{"w", {1, 16}, DType::bfloat16}, 1, 1);
  expect_error(x.view(), w2.view(), out.view(), "weight", "must have shape [16]");
}
TEST_F(ErrorFixture, OutShapeAndDtype) {
  Buffer o2 = cases::make_buffer({2, 32}, DType::bfloat16);
  expect_error(x.view(), w.view(), o2.view(), "out", "shape of x [4, 16]");
  Buffer of = cases::make_buffer({4, 16}, DType::float16);
  expect_error(x.view(), w.view(), of.view(), "out", "dtype bfloat16");
  Buffer wf = cases::make_normal(TensorSpec{"w", {16}, DType::float32}, 1, 1);
  expect_error(x.view(), wf.view(), out.view(), "out", "dtype float32");
}
TEST_F(ErrorFixture, RankZeroAndTooHigh) {
  TensorView scalar = x.view();
  scalar.rank = 0;
  expect_error(scalar, w.view(), out.view(), "x", "rank 0");
  TensorView nine = x.view();
  nine.rank = 9;
  expect_error(nine, w.view(), out.view(), "x", "rank 1 to 8");
}
TEST_F(ErrorFixture, LastDimMustBeContiguous) {
  TensorView xs = x.view();
  xs.shape[0] = 4, xs.shape[1] = 8, xs.strides[1] = 2;
  Buffer w8 = cases::make_normal(TensorSpec{"w", {8}, DType::bfloat16}, 1, 1);
  Buffer o8 = cases::make_buffer({4, 8}, DType::bfloat16);
  std::memset(out.bytes.data(), 0x5a, out.bytes.size());
  expect_error(xs, w8.view(), o8.view(), "x", "contiguous in its last dim");
  TensorView os = out.view();
  os.shape[1] = 8, os.strides[1] = 2;
  expect_error(TensorView::contiguous(x.bytes.data(), DType::bfloat16, {4, 8}), w8.view(), os, "out",
               "contiguous in its last dim");
}
TEST_F(ErrorFixture, PartialOverlapIsRefused) {
  TensorView shifted = x.view();
  shifted.data = x.bytes.data() + 2 * 16;  // one row later: overlaps rows 1..3 of x
  shifted.shape[0] = 3;
  TensorView xv = x.view();
  xv.shape[0] = 3;
  const auto x_before = x.bytes;
  try {
    rms_norm(xv, w.view(), shifted);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "out");
    EXPECT_NE(std::string(e.what()).find("overlaps x"), std::string::npos);
  }
  EXPECT_EQ(x.bytes, x_before);
  TensorView self = out.view();
  self.strides[0] = 0;  // every row the same memory
  expect_error(x.view(), w.view(), self, "out", "overlapping elements");
  const auto w_before = w.bytes;
  try {  // out on top of the weight
    rms_norm(TensorView::contiguous(x.bytes.data(), DType::bfloat16, {1, 16}), w.view(),
             TensorView::contiguous(w.bytes.data(), DType::bfloat16, {1, 16}));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlaps weight"), std::string::npos) << e.what();
  }
  EXPECT_EQ(w.bytes, w_before);
}
TEST_F(ErrorFixture, NullDataAndBadEps) {
  TensorView nx = x.view();
  nx.data = nullptr;
  expect_error(nx, w.view(), out.view(), "x", "null pointer");
  TensorView nw = w.view();
  nw.data = nullptr;
  expect_error(x.view(), nw, out.view(), "weight", "null pointer");
  RmsNormOptions neg;
  neg.eps = -1;
  expect_error(x.view(), w.view(), out.view(), "eps", "finite number >= 0", neg);
  neg.eps = NAN;
  expect_error(x.view(), w.view(), out.view(), "eps", "finite number >= 0", neg);
}

}  // namespace
}  // namespace opgym
