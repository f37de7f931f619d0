// The CUDA RMSNorm against the CPU path, bit for bit: every dtype pair x both modes x the listed
// last dims (every kernel: warp rows with 1- and 2-element lane access, a block per row from shared
// memory, a block per row streaming a row larger than shared memory) x contiguous / row-strided /
// misaligned (x and out, or the weight alone) / in-place layouts; plus NaN/Inf, Gemma's weight
// offset, grid-stride loops, 64-bit offsets, a user stream and CUDA graph capture. The whole storage
// of out is compared, padding included, so a write outside the view fails too.
//
// Without a GPU the device tests skip with the reason; the plan and the argument errors (thrown
// before anything touches the device) run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cases/inputs.hpp"
#include "core/convert.hpp"
#include "opgym/cuda.hpp"
#include "opgym/opgym.hpp"

namespace opgym {
namespace {

using cases::Buffer;
using cases::TensorSpec;
using Bytes = decltype(Buffer::bytes);

// The CPU reference in the GPU's sum order (the CPU's default is torch's own order).
RmsNormOptions lanes64(RmsNormOptions o = {}) {
  o.sum_order = SumOrder::lanes64;
  return o;
}

const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

bool have_gpu(std::string* why) { return cuda::device_count(why) > 0; }
#define REQUIRE_GPU()                                                     \
  do {                                                                    \
    std::string why_;                                                     \
    if (!have_gpu(&why_)) GTEST_SKIP() << "no CUDA device (" << why_ << ")"; \
  } while (0)
#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

// Device memory with a host mirror of the same bytes.
struct Dev {
  void* ptr = nullptr;
  size_t bytes = 0;
  Dev() = default;
  explicit Dev(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n ? n : 1) != cudaSuccess) {
      cudaGetLastError();
      ptr = nullptr;
    }
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { if (ptr) cudaFree(ptr); }
};

// A tensor inside a storage buffer: element offset + strides, mirrored on the device.
struct T {
  Buffer storage;  // host bytes; the device copy starts equal
  std::unique_ptr<Dev> dev;
  int64_t offset = 0;
  std::vector<int64_t> shape, strides;
  DType dtype = DType::float32;

  TensorView at(void* base) const {
    char* p = static_cast<char*>(base) + offset * static_cast<int64_t>(dtype_size(dtype));
    return TensorView::strided(p, dtype, shape.data(), strides.data(), static_cast<int>(shape.size()));
  }
  TensorView host() { return at(storage.bytes.data()); }
  TensorView device() const { return at(dev->ptr); }
  void upload() {
    dev = std::make_unique<Dev>(storage.bytes.size());
    ASSERT_NE(dev->ptr, nullptr);
    ASSERT_EQ(cudaMemcpy(dev->ptr, storage.bytes.data(), storage.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  Bytes download() const {
    Bytes b(storage.bytes.size());
    EXPECT_EQ(cudaMemcpy(b.data(), dev->ptr, b.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return b;
  }
};

enum class Layout { contiguous, row_strided, misaligned, misaligned_weight, in_place };
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::row_strided: return "row-strided";
    case Layout::misaligned: return "misaligned";
    case Layout::misaligned_weight: return "misaligned-weight";
    default: return "in-place";
  }
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

// row_strided: each row padded by 3 elements and, from rank 3 on, one spare row per outer index
// (the leading dims do not collapse). misaligned: contiguous, one element into the storage.
T make_tensor(const std::vector<int64_t>& shape, DType dt, Layout layout, uint64_t seed, int index) {
  T t;
  t.shape = shape;
  t.dtype = dt;
  const int rank = static_cast<int>(shape.size());
  if (layout == Layout::row_strided) {
    std::vector<int64_t> padded = shape;
    padded[rank - 1] += 3;
    if (rank >= 3) padded[rank - 2] += 1;
    t.storage = cases::make_normal(TensorSpec{"t", padded, dt}, seed, index);
    t.strides = contiguous_strides(padded);
  } else {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const int64_t extra = layout == Layout::misaligned ? 1 : 0;
    t.storage = cases::make_normal(TensorSpec{"t", {n + extra}, dt}, seed, index);
    t.offset = extra;
    t.strides = contiguous_strides(shape);
  }
  return t;
}

std::string first_difference(const Bytes& got, const Bytes& want, DType dt) {
  const size_t es = dtype_size(dt);
  for (size_t i = 0; i < got.size(); i += es)
    if (std::memcmp(got.data() + i, want.data() + i, es) != 0) {
      auto val = [&](const unsigned char* p) {
        if (dt == DType::float32) { float f; std::memcpy(&f, p, 4); return static_cast<double>(f); }
        uint16_t h; std::memcpy(&h, p, 2);
        return static_cast<double>(dt == DType::float16 ? f16_to_f32(h) : bf16_to_f32(h));
      };
      return "storage element " + std::to_string(i / es) + ": gpu " + std::to_string(val(got.data() + i)) + ", cpu " +
             std::to_string(val(want.data() + i));
    }
  return "none";
}

// Runs one call on the CPU and on the GPU from the same bytes; returns "" when out's whole storage
// is bit-identical, else where it differs.
std::string compare_with_cpu(const std::vector<int64_t>& shape, DType xt, DType wt, Layout layout, const RmsNormOptions& opt,
                             uint64_t seed, cudaStream_t stream = nullptr) {
  const DType ot = rms_norm_out_dtype(xt, wt);
  // misaligned_weight: x and out aligned, the weight one element into its allocation.
  const Layout xl = layout == Layout::misaligned_weight ? Layout::contiguous : layout;
  T x = make_tensor(shape, xt, xl, seed, 0);
  T w = make_tensor({shape.back()}, wt, layout == Layout::misaligned_weight ? Layout::misaligned : Layout::contiguous, seed, 1);
  T out = layout == Layout::in_place ? T{} : make_tensor(shape, ot, xl, seed, 2);
  x.upload();
  w.upload();
  if (layout != Layout::in_place) out.upload();
  T& o = layout == Layout::in_place ? x : out;

  cuda::rms_norm(x.device(), w.device(), o.device(), opt, stream);
  if (cudaStreamSynchronize(stream) != cudaSuccess) return std::string("cuda error: ") + cudaGetErrorString(cudaGetLastError());
  const auto got = o.download();
  rms_norm(x.host(), w.host(), o.host(), lanes64(opt));  // the CPU path in the GPU's sum order
  if (got == o.storage.bytes) return "";
  return first_difference(got, o.storage.bytes, ot);
}

std::string where(const std::vector<int64_t>& shape, DType xt, DType wt, Layout l, const RmsNormOptions& opt) {
  std::string s = std::string(dtype_name(xt)) + "/" + dtype_name(wt) + " " + layout_name(l) + " " + mode_name(opt.mode) +
                  (opt.weight_offset ? " offset" : "") + " [";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- device: bit-exact with the CPU path --------------------------------------------------------

class CudaRmsNormMatrix : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

TEST_P(CudaRmsNormMatrix, BitIdenticalToTheCpuPath) {
  REQUIRE_GPU();
  const auto [xt, wt] = GetParam();
  const DType ot = rms_norm_out_dtype(xt, wt);
  // warp_rows (<= 128, <= 512, <= 2048 per lane capacity), block_row_smem, block_row_global.
  const int64_t dims[] = {1, 2, 3, 7, 31, 32, 33, 64, 127, 128, 129, 255, 256, 512, 513, 768, 769, 1280, 2047, 2048,
                          2049, 3000, 4096, 5125, 8192, 12289, 16384, 40000, 70001, 120000};
  int checked = 0;
  for (int64_t dim : dims) {
    std::vector<int64_t> shape = dim <= 2048 ? std::vector<int64_t>{3, 5, dim} : std::vector<int64_t>{2, 3, dim};
    if (dim >= 40000) shape = {3, dim};
    for (Layout layout : {Layout::contiguous, Layout::row_strided, Layout::misaligned, Layout::misaligned_weight,
                          Layout::in_place}) {
      if (layout == Layout::in_place && ot != xt) continue;
      for (NormMode mode : {NormMode::hf, NormMode::fp32}) {
        RmsNormOptions opt;
        opt.mode = mode;
        const std::string diff = compare_with_cpu(shape, xt, wt, layout, opt, 7000 + dim);
        ASSERT_EQ(diff, "") << where(shape, xt, wt, layout, opt);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 150);
}

std::string param_name(const ::testing::TestParamInfo<CudaRmsNormMatrix::ParamType>& info) {
  const auto [x, w] = info.param;
  return std::string("x_") + dtype_name(x) + "_w_" + dtype_name(w);
}
INSTANTIATE_TEST_SUITE_P(AllDtypes, CudaRmsNormMatrix,
                         ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::ValuesIn(kDtypes)), param_name);

TEST(CudaRmsNorm, RanksOneToFiveAndWeightOffset) {
  REQUIRE_GPU();
  const std::vector<std::vector<int64_t>> shapes = {{2048}, {777}, {4, 128}, {2, 3, 128}, {2, 1, 3, 200}, {2, 2, 1, 3, 4100}};
  for (const auto& shape : shapes)
    for (Layout layout : {Layout::contiguous, Layout::row_strided})
      for (bool offset : {false, true}) {
        RmsNormOptions opt;
        opt.weight_offset = offset;
        opt.eps = 1e-5;
        ASSERT_EQ(compare_with_cpu(shape, DType::bfloat16, DType::bfloat16, layout, opt, 42), "")
            << where(shape, DType::bfloat16, DType::bfloat16, layout, opt);
      }
}

TEST(CudaRmsNorm, ManyRowsLoopOverTheGrid) {
  REQUIRE_GPU();
  // More rows than the grid's 8192 blocks hold: warp rows (4 per block) and a block per row.
  ASSERT_EQ(compare_with_cpu({40000, 128}, DType::bfloat16, DType::bfloat16, Layout::contiguous, {}, 1), "");
  ASSERT_EQ(compare_with_cpu({33000, 2, 64}, DType::float16, DType::float32, Layout::row_strided, {}, 2), "");
  ASSERT_EQ(compare_with_cpu({9000, 2304}, DType::bfloat16, DType::bfloat16, Layout::contiguous, {}, 3), "");
}

TEST(CudaRmsNorm, UserStream) {
  REQUIRE_GPU();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  EXPECT_EQ(compare_with_cpu({7, 2048}, DType::bfloat16, DType::bfloat16, Layout::contiguous, {}, 5, s), "");
  EXPECT_EQ(compare_with_cpu({7, 8192}, DType::float16, DType::float16, Layout::contiguous, {}, 6, s), "");
  cudaStreamDestroy(s);
}

TEST(CudaRmsNorm, NanAndInfPropagateAsTorchsFormula) {
  REQUIRE_GPU();
  for (int64_t dim : {100, 3000}) {
    for (DType dt : kDtypes) {
      T x = make_tensor({4, dim}, dt, Layout::contiguous, 3, 0);
      T w = make_tensor({dim}, dt, Layout::contiguous, 3, 1);
      T out = make_tensor({4, dim}, dt, Layout::contiguous, 3, 2);
      auto set = [&](int64_t i, float v) {
        if (dt == DType::float32) reinterpret_cast<float*>(x.storage.bytes.data())[i] = v;
        else reinterpret_cast<uint16_t*>(x.storage.bytes.data())[i] = dt == DType::float16 ? f32_to_f16(v) : f32_to_bf16(v);
      };
      set(5, NAN);              // row 0: all NaN
      set(dim + 7, INFINITY);   // row 1: NaN at the inf (inf * 0), zeros elsewhere
      set(2 * dim + dim - 1, -INFINITY);
      x.upload();
      w.upload();
      out.upload();
      cuda::rms_norm(x.device(), w.device(), out.device());
      CUDA_OK(cudaDeviceSynchronize());
      const auto got_bytes = out.download();
      rms_norm(x.host(), w.host(), out.host(), lanes64());
      Buffer got = out.storage;
      got.bytes = got_bytes;
      for (int64_t i = 0; i < 4 * dim; ++i) {
        const double g = got.at(i), e = out.storage.at(i);
        if (std::isnan(e)) ASSERT_TRUE(std::isnan(g)) << dtype_name(dt) << " " << i;  // NaN encodings may differ
        else ASSERT_EQ(g, e) << dtype_name(dt) << " " << i;
      }
      for (int64_t i = 0; i < dim; ++i) EXPECT_TRUE(std::isnan(got.at(i)));
      EXPECT_TRUE(std::isnan(got.at(dim + 7)));
      EXPECT_EQ(got.at(dim + 8), 0.0);
      EXPECT_FALSE(std::isnan(got.at(3 * dim + 5)));  // row 3 untouched by the others
    }
  }
}

TEST(CudaRmsNorm, CapturedInACudaGraph) {
  REQUIRE_GPU();
  // 30000 bf16 needs more than 48 KiB of shared memory: cudaFuncSetAttribute runs during capture.
  for (int64_t dim : {2048, 5120, 30000}) {
    T x = make_tensor({1, 1, dim}, DType::bfloat16, Layout::contiguous, 9, 0);
    T w = make_tensor({dim}, DType::bfloat16, Layout::contiguous, 9, 1);
    T out = make_tensor({1, 1, dim}, DType::bfloat16, Layout::contiguous, 9, 2);
    x.upload();
    w.upload();
    out.upload();
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    // Global mode: any synchronization or allocation inside the call would invalidate the capture.
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cuda::rms_norm(x.device(), w.device(), out.device(), {}, s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaMemset(out.dev->ptr, 0, out.dev->bytes));
    for (int k = 0; k < 3; ++k) CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    const auto got = out.download();
    rms_norm(x.host(), w.host(), out.host(), lanes64());
    EXPECT_EQ(got, out.storage.bytes) << first_difference(got, out.storage.bytes, DType::bfloat16);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  }
}

// Two rows 2^31 + 64 elements apart, read and written in place: offsets past 4 GiB.
TEST(CudaRmsNorm, SixtyFourBitOffsets) {
  REQUIRE_GPU();
  for (int64_t dim : {64, 4096}) {
    const int64_t stride = (int64_t{1} << 31) + 64;
    Dev mem(static_cast<size_t>((stride + dim) * 2));
    if (!mem.ptr) GTEST_SKIP() << "cannot allocate " << (stride + dim) * 2 / (1 << 20) << " MiB on the device";
    std::vector<uint16_t> row(dim);
    for (int64_t i = 0; i < dim; ++i) row[i] = f32_to_bf16(static_cast<float>(i % 7) - 3.0f);
    auto* base = static_cast<uint16_t*>(mem.ptr);
    CUDA_OK(cudaMemcpy(base, row.data(), dim * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(base + stride, row.data(), dim * 2, cudaMemcpyHostToDevice));
    T w = make_tensor({dim}, DType::bfloat16, Layout::contiguous, 4, 1);
    w.upload();
    const int64_t shape[] = {2, dim}, strides[] = {stride, 1};
    const auto x = TensorView::strided(base, DType::bfloat16, shape, strides, 2);
    cuda::rms_norm(x, w.device(), x);  // in place, the second row past 4 GiB
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> r0(dim), r1(dim), want(row);
    CUDA_OK(cudaMemcpy(r0.data(), base, dim * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(r1.data(), base + stride, dim * 2, cudaMemcpyDeviceToHost));
    rms_norm(TensorView::contiguous(want.data(), DType::bfloat16, {dim}), w.host(),
             TensorView::contiguous(want.data(), DType::bfloat16, {dim}), lanes64());
    EXPECT_EQ(r0, want);
    EXPECT_EQ(r1, want);
  }
}

TEST(CudaRmsNorm, ZeroRowsLaunchesNothing) {
  // Returns before touching the device, so it runs without a GPU too.
  uint16_t w[8] = {};
  const int64_t shape[] = {0, 8};
  auto x = TensorView::contiguous(nullptr, DType::bfloat16, shape, 2);
  EXPECT_NO_THROW(cuda::rms_norm(x, TensorView::contiguous(w, DType::bfloat16, {8}), x));
}

TEST(CudaRmsNorm, WithoutAGpuACallIsARuntimeError) {
  std::string why;
  if (have_gpu(&why)) GTEST_SKIP() << "a GPU is present";
  std::vector<uint16_t> x(16), w(16), out(16);
  try {
    cuda::rms_norm(TensorView::contiguous(x.data(), DType::bfloat16, {16}), TensorView::contiguous(w.data(), DType::bfloat16, {16}),
                   TensorView::contiguous(out.data(), DType::bfloat16, {16}));
    ADD_FAILURE() << "no error without a device";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(dynamic_cast<const Error*>(&e), nullptr) << "not an argument error: " << e.what();
    EXPECT_NE(std::string(e.what()).find("opgym::cuda::rms_norm"), std::string::npos) << e.what();
  }
}

// ---- the plan: host logic, no GPU needed ---------------------------------------------------------

cuda::RmsNormPlan plan(std::vector<int64_t> shape, DType xt, DType wt, size_t smem = 0, void* data = nullptr,
                       std::vector<int64_t> strides = {}) {
  if (strides.empty()) strides = contiguous_strides(shape);
  const int r = static_cast<int>(shape.size());
  const auto x = TensorView::strided(data, xt, shape.data(), strides.data(), r);
  const auto out = TensorView::strided(data, rms_norm_out_dtype(xt, wt), shape.data(), strides.data(), r);
  const int64_t d = shape.back();
  return cuda::plan_rms_norm(x, TensorView::strided(nullptr, wt, &d, strides.data() + r - 1, 1), out, smem);
}

TEST(CudaRmsNormPlan, FollowsTheShape) {
  using K = cuda::RmsNormKernel;
  const DType bf = DType::bfloat16, f32 = DType::float32;
  auto decode = plan({1, 1, 2048}, bf, bf);
  EXPECT_EQ(decode.kernel, K::warp_rows);
  EXPECT_EQ(decode.vec, 2);
  EXPECT_EQ(decode.elems_per_lane, 64);
  EXPECT_EQ(decode.blocks, 1);
  EXPECT_EQ(decode.threads, 128);
  auto head = plan({1, 512, 16, 128}, bf, bf);  // per-head norm: a warp per row, 4 rows per block
  EXPECT_EQ(head.kernel, K::warp_rows);
  EXPECT_EQ(head.rows, 512 * 16);
  EXPECT_EQ(head.elems_per_lane, 4);
  EXPECT_EQ(head.blocks, 512 * 16 / 4);
  EXPECT_EQ(plan({7, 300}, bf, bf).elems_per_lane, 16);
  EXPECT_EQ(plan({7, 769}, bf, bf).vec, 1);  // odd row stride: rows alternate alignment
  EXPECT_EQ(plan({1, 769}, bf, bf).vec, 2);  // one row, even-aligned start
  EXPECT_EQ(plan({1 << 20, 128}, bf, bf).blocks, 8192);  // blocks loop over the rest
  EXPECT_FALSE(plan({2, 3, 64}, bf, bf, 0, nullptr, {400, 100, 1}).rows_collapse);

  auto prefill = plan({1, 4096, 4096}, bf, bf);
  EXPECT_EQ(prefill.kernel, K::block_row_smem);
  EXPECT_EQ(prefill.vec, 8);
  EXPECT_EQ(prefill.threads, 256);
  EXPECT_EQ(prefill.smem_bytes, (4096u + 8) * 2);
  EXPECT_EQ(plan({3, 20000}, f32, f32).kernel, K::block_row_global);            // 80 KB > 48 KiB default
  EXPECT_EQ(plan({3, 20000}, f32, f32, 227 * 1024).kernel, K::block_row_smem);  // H100/H200 opt-in
  auto huge = plan({2, 100000}, f32, f32, 227 * 1024);
  EXPECT_EQ(huge.kernel, K::block_row_global);
  EXPECT_LE(huge.smem_bytes, 48u * 1024);
  EXPECT_EQ((huge.smem_bytes / 4 - 4) % 32, 0u);  // chunks of whole 32-element groups
  EXPECT_NE(prefill.describe().find("block_row_smem"), std::string::npos);
  EXPECT_NE(decode.describe().find("warp_rows"), std::string::npos);
}

TEST(CudaRmsNormPlan, VectorWidthFollowsPointerAlignment) {
  alignas(16) static unsigned char mem[64];
  const DType bf = DType::bfloat16;
  EXPECT_EQ(plan({4, 64}, bf, bf, 0, mem).vec, 2);
  EXPECT_EQ(plan({4, 64}, bf, bf, 0, mem + 2).vec, 1);  // one element in: pairs would straddle
  EXPECT_EQ(plan({4, 64}, bf, bf, 0, mem + 4).vec, 2);
  EXPECT_EQ(plan({4, 64}, DType::float32, DType::float32, 0, mem + 4).vec, 1);  // fp32 pairs need 8 bytes
}

// ---- errors: the CPU front's messages, raised before anything touches the device ------------------

struct CudaErrors : ::testing::Test {
  Buffer x = cases::make_normal(TensorSpec{"x", {4, 16}, DType::bfloat16}, 1, 0);
  Buffer w = cases::make_normal(TensorSpec{"w", {16}, DType::bfloat16}, 1, 1);
  Buffer out = cases::make_buffer({4, 16}, DType::bfloat16);
  // Host memory on purpose: an error must be thrown before any pointer is used.
  void expect_error(const TensorView& xv, const TensorView& wv, const TensorView& ov, const std::string& arg,
                    const std::string& expected, RmsNormOptions opt = {}) {
    std::string cpu_message;
    try {
      rms_norm(xv, wv, ov, opt);
    } catch (const Error& e) {
      cpu_message = e.what();
    }
    try {
      cuda::rms_norm(xv, wv, ov, opt);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      if (!cpu_message.empty()) EXPECT_EQ(e.what(), cpu_message) << "the CPU front words it differently";
    }
  }
};

TEST_F(CudaErrors, SameMessagesAsTheCpuFront) {
  TensorView bad = x.view();
  bad.dtype = static_cast<DType>(7);
  expect_error(bad, w.view(), out.view(), "x", "float32, float16 or bfloat16");
  Buffer w8 = cases::make_normal(TensorSpec{"w", {8}, DType::bfloat16}, 1, 1);
  expect_error(x.view(), w8.view(), out.view(), "weight", "must have shape [16]");
  Buffer o2 = cases::make_buffer({2, 32}, DType::bfloat16);
  expect_error(x.view(), w.view(), o2.view(), "out", "shape of x [4, 16]");
  Buffer of = cases::make_buffer({4, 16}, DType::float16);
  expect_error(x.view(), w.view(), of.view(), "out", "dtype bfloat16");
  Buffer wf = cases::make_normal(TensorSpec{"w", {16}, DType::float32}, 1, 1);
  expect_error(x.view(), wf.view(), out.view(), "out", "dtype float32");
  TensorView scalar = x.view();
  scalar.rank = 0;
  expect_error(scalar, w.view(), out.view(), "x", "rank 0");
  TensorView xs = x.view();
  xs.shape[1] = 8, xs.strides[1] = 2;
  expect_error(xs, w8.view(), cases::make_buffer({4, 8}, DType::bfloat16).view(), "x", "contiguous in its last dim");
  TensorView shifted = x.view();
  shifted.data = x.bytes.data() + 2 * 16;
  shifted.shape[0] = 3;
  TensorView xv = x.view();
  xv.shape[0] = 3;
  expect_error(xv, w.view(), shifted, "out", "overlaps x");
  TensorView self = out.view();
  self.strides[0] = 0;
  expect_error(x.view(), w.view(), self, "out", "overlapping elements");
  expect_error(TensorView::contiguous(x.bytes.data(), DType::bfloat16, {1, 16}), w.view(),
               TensorView::contiguous(w.bytes.data(), DType::bfloat16, {1, 16}), "out", "overlaps weight");
  TensorView nx = x.view();
  nx.data = nullptr;
  expect_error(nx, w.view(), out.view(), "x", "null pointer");
  RmsNormOptions neg;
  neg.eps = -1;
  expect_error(x.view(), w.view(), out.view(), "eps", "finite number >= 0", neg);
  neg.eps = NAN;
  expect_error(x.view(), w.view(), out.view(), "eps", "finite number >= 0", neg);
  RmsNormOptions order;  // the CPU's torch order cannot be asked of the GPU
  order.sum_order = SumOrder::torch_cpu;
  expect_error(x.view(), w.view(), out.view(), "sum_order", "CPU's order", order);
}

TEST_F(CudaErrors, ElementMisalignedPointers) {
  TensorView odd = x.view();
  odd.data = x.bytes.data() + 1;
  odd.shape[0] = 3;
  Buffer o3 = cases::make_buffer({3, 16}, DType::bfloat16);
  expect_error(odd, w.view(), o3.view(), "x", "aligned to its element size (2 bytes)");
}

}  // namespace
}  // namespace opgym
