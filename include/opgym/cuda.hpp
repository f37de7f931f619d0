// The CUDA backend: the same operators on NVIDIA GPUs, with the same numeric contract and the same
// argument errors as the CPU path. No torch types; data pointers are device pointers (or managed).
//
// Present in the library when it was built with CUDA (the build defines OPGYM_HAVE_CUDA=1 for the
// library and everything that links it; cmake/cuda.cmake). Each op declares its own CUDA entry points
// (namespace opgym::cuda) in its own header, include/opgym/<op>.hpp, with no CUDA header needed:
// `cudaStream_t` is `CUstream_st*`, declared there the way cuda_runtime_api.h declares it. This header
// holds what is not one op's (device_count) and includes every op's header (opgym/opgym.hpp).
#pragma once
#include <string>

#include "opgym/opgym.hpp"

namespace opgym::cuda {

// How many CUDA devices this process can use; 0 when there is no driver or no GPU (never throws).
// `why`, when given, receives the CUDA error text in that case.
int device_count(std::string* why = nullptr);

}  // namespace opgym::cuda
