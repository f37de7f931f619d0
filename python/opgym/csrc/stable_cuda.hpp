// What every op's CUDA binding on torch's stable ABI shares (python/opgym/ops/<op>/<op>_cuda.cpp, built into
// opgym/_stable_cuda.so with USE_CUDA defined, so torch's C shim declares its CUDA functions): the tensor's
// device made current and torch's current stream on it, both from torch's C shim, whose functions keep
// their signatures across releases. In the 2.11 headers (the floor, TORCH_TARGET_VERSION):
//   torch/csrc/stable/accelerator.h        torch::stable::accelerator::DeviceGuard (2.9 on:
//                                          aoti_torch_create_device_guard, libtorch_cpu)
//   torch/csrc/inductor/aoti_torch/c/shim.h aoti_torch_get_current_cuda_stream (under USE_CUDA; defined in
//                                          libtorch_cuda, so this library links it)
// The stable accelerator API's getCurrentStream returns a stream id, not a cudaStream_t, so the shim's
// CUDA function is the one that hands the core its stream. Outputs come from torch::stable::empty (the
// dispatcher's aten::empty: torch's caching allocator, so CUDA graph capture works); the CPU kernels'
// output pool (block_pool.hpp) is host memory and not used here.
#pragma once
#ifndef USE_CUDA
#error "csrc/stable_cuda.hpp needs USE_CUDA (python/CMakeLists.txt defines it for opgym/_stable_cuda.so)"
#endif
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/headeronly/util/shim_utils.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "csrc/stable.hpp"

struct CUstream_st;  // cudaStream_t (the core's CUDA entry points take it; no CUDA header needed)

namespace opgym_stable {

// Makes t's device current until it goes out of scope (launches and allocations land there).
inline torch::stable::accelerator::DeviceGuard device_guard(const Tensor& t) {
  return torch::stable::accelerator::DeviceGuard(t.get_device_index());
}

// torch's current CUDA stream on t's device (torch.cuda.current_stream(t.device)): the core enqueues there.
inline CUstream_st* current_stream(const Tensor& t) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return static_cast<CUstream_st*>(stream);
}

// A contiguous tensor on `like`'s device, from torch's allocator (the caching allocator on CUDA). Through
// the shim's aoti_torch_empty_strided (at::empty_strided, an unboxed call, as the ATen bindings' at::empty
// was), not torch::stable::empty (the boxed dispatcher's aten::empty): measured from C++ on this machine's
// CPU tensors, about 0.3-0.7 us a call against 1-2.5 us, per output of every call.
inline Tensor empty_on_device(torch::headeronly::IntHeaderOnlyArrayRef sizes, ScalarType dtype, const Tensor& like) {
  const int64_t rank = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> strides(sizes.size());
  int64_t st = 1;
  for (int64_t i = rank; i-- > 0;) {
    strides[static_cast<size_t>(i)] = st;
    st *= std::max<int64_t>(sizes[static_cast<size_t>(i)], 1);
  }
  int32_t shim_dtype = aoti_torch_dtype_float32();
  if (dtype == ScalarType::Half) shim_dtype = aoti_torch_dtype_float16();
  else if (dtype == ScalarType::BFloat16) shim_dtype = aoti_torch_dtype_bfloat16();
  else if (dtype != ScalarType::Float) runtime_error("opgym: an output of dtype ", dtype_name(dtype));
  int32_t device_type = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  AtenTensorHandle out = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(rank, sizes.data(), strides.data(), shim_dtype, device_type,
                                                  like.get_device_index(), &out));
  return Tensor(out);
}

}  // namespace opgym_stable
