// What the CUDA backend has that is no op's (include/opgym/cuda.hpp); each op's kernels sit in its
// folder (src/ops/<op>/<op>.cu).
#include <cuda_runtime.h>

#include <string>

#include "opgym/cuda.hpp"

namespace opgym::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    cudaGetLastError();  // not sticky: clear it so later launches report their own errors
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

}  // namespace opgym::cuda
