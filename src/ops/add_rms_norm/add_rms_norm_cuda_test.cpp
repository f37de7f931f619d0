// The CUDA add_rms_norm against the CPU path in the GPU's sum order (lanes64), bit for bit: every
// dtype pair x last dims x row counts, functional and in place (out = x, sum_out = residual), both
// outputs compared. Without a GPU the device tests skip with the reason; the argument errors (thrown
// before anything touches the device) run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cases/inputs.hpp"
#include "opgym/cuda.hpp"
#include "opgym/opgym.hpp"

namespace opgym {
namespace {

using cases::Buffer;
using cases::TensorSpec;

const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

#define REQUIRE_GPU()                                                        \
  do {                                                                       \
    std::string why_;                                                        \
    if (cuda::device_count(&why_) == 0) GTEST_SKIP() << "no CUDA device (" << why_ << ")"; \
  } while (0)

// A device copy of a host buffer, freed at scope exit.
struct DevBuf {
  void* ptr = nullptr;
  explicit DevBuf(const Buffer& b) {
    if (cudaMalloc(&ptr, b.bytes.size() ? b.bytes.size() : 1) != cudaSuccess) ptr = nullptr;
    if (ptr) cudaMemcpy(ptr, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { if (ptr) cudaFree(ptr); }
  TensorView view(const Buffer& like) const {
    TensorView v = const_cast<Buffer&>(like).view();
    v.data = ptr;
    return v;
  }
  Buffer download(const Buffer& like) const {
    Buffer b = like;
    cudaMemcpy(b.bytes.data(), ptr, b.bytes.size(), cudaMemcpyDeviceToHost);
    return b;
  }
};

TEST(AddRmsNormCuda, BitExactWithTheCpuInTheGpuOrder) {
  REQUIRE_GPU();
  RmsNormOptions opt;
  opt.sum_order = SumOrder::lanes64;
  uint64_t seed = 100;
  for (DType xt : kDtypes)
    for (DType wt : kDtypes)
      for (int64_t dim : {7, 128, 1280, 2048, 5120, 20000})
        for (int64_t rows : {1, 3, 1000}) {
          const DType ot = rms_norm_out_dtype(xt, wt);
          const std::vector<int64_t> shape{rows, dim};
          ++seed;
          Buffer x = cases::make_normal(TensorSpec{"x", shape, xt}, seed, 0);
          Buffer r = cases::make_normal(TensorSpec{"r", shape, xt}, seed, 1);
          Buffer w = cases::make_normal(TensorSpec{"w", {dim}, wt}, seed, 2);
          Buffer want = cases::make_buffer(shape, ot), want_sum = cases::make_buffer(shape, xt);
          add_rms_norm(x.view(), r.view(), w.view(), want.view(), want_sum.view(), opt);
          DevBuf dx(x), dr(r), dw(w), dout(want), dsum(want_sum);
          ASSERT_TRUE(dx.ptr && dr.ptr && dw.ptr && dout.ptr && dsum.ptr);
          cuda::add_rms_norm(dx.view(x), dr.view(r), dw.view(w), dout.view(want), dsum.view(want_sum));
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::string where = std::string(dtype_name(xt)) + "/" + dtype_name(wt) + " [" + std::to_string(rows) +
                                    ", " + std::to_string(dim) + "]";
          EXPECT_EQ(dsum.download(want_sum).bytes, want_sum.bytes) << "sum " << where;
          EXPECT_EQ(dout.download(want).bytes, want.bytes) << "out " << where;
          if (ot == xt) {  // in place: x <- normed, residual <- sum
            cuda::add_rms_norm(dx.view(x), dr.view(r), dw.view(w), dx.view(x), dr.view(r));
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            EXPECT_EQ(dx.download(x).bytes, want.bytes) << "in place out " << where;
            EXPECT_EQ(dr.download(r).bytes, want_sum.bytes) << "in place sum " << where;
          }
        }
}

TEST(AddRmsNormCuda, ArgumentErrorsBeforeAnyLaunch) {
  Buffer x = cases::make_buffer({4, 16}, DType::bfloat16), w = cases::make_buffer({16}, DType::bfloat16);
  Buffer rf = cases::make_buffer({4, 16}, DType::float32), out = cases::make_buffer({4, 16}, DType::bfloat16);
  Buffer sum = cases::make_buffer({4, 16}, DType::bfloat16);
  try {
    cuda::add_rms_norm(x.view(), rf.view(), w.view(), out.view(), sum.view());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "residual");
  }
  RmsNormOptions cpu_order;
  cpu_order.sum_order = SumOrder::torch_cpu;
  try {
    cuda::add_rms_norm(x.view(), x.view(), w.view(), out.view(), sum.view(), cpu_order);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "sum_order");
  }
}

}  // namespace
}  // namespace opgym
