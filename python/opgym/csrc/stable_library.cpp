// The stable-ABI library's own kernels (schemas: python/opgym/_schemas.py): opgym::build_info and the
// opgym_internal helpers (parallel_probe, the output pool's controls), and empty_output.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "block_pool.hpp"
#include "stable.hpp"

#ifndef OPGYM_EXT_CUDA
#define OPGYM_EXT_CUDA 0
#endif

namespace opgym_stable {
namespace {
size_t element_size(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return 4;
    case ScalarType::Half:
    case ScalarType::BFloat16: return 2;
    default: value_error("opgym: an output of dtype ", dtype_name(t), " (opgym's outputs are float32, float16, bfloat16)");
  }
}
}  // namespace

Tensor empty_output(torch::headeronly::IntHeaderOnlyArrayRef sizes, ScalarType dtype) {
  int64_t numel = 1;
  for (const int64_t s : sizes) numel *= s;
  const size_t bytes = static_cast<size_t>(numel) * element_size(dtype);
  opgym_torch::PoolBlock* block = nullptr;
  void* data = opgym_torch::BlockPool::acquire(bytes, &block);
  OPGYM_CHECK(data, "opgym: not enough memory for a ", bytes, "-byte output");
  std::vector<int64_t> strides(sizes.size());
  int64_t st = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = st;
    st *= std::max<int64_t>(sizes[i], 1);
  }
  return torch::stable::from_blob(data, sizes, strides, torch::stable::Device(torch::headeronly::DeviceType::CPU),
                                  dtype, [block](void*) { opgym_torch::BlockPool::release(block); });
}

}  // namespace opgym_stable

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

std::string build_info() {
  return std::string("opgym ") + opgym::kVersion + "; cpu isa " + opgym::isa_name(opgym::active_cpu_isa()) +
         "; cpu features: " + opgym::cpu_features() + "; swiglu exp: " + opgym::swiglu_exp_library() +
         "; cuda operators: " + (OPGYM_EXT_CUDA ? "yes" : "no") + "; torch ABI: stable";
}

// How many distinct threads the core's executor inside torch really uses for n tasks.
constexpr int64_t kMaxProbeTasks = 4096;  // 200 us each: at most ~0.8 s of spinning on one thread
int64_t parallel_probe(int64_t n) {
  OPGYM_CHECK_VALUE(n >= 1 && n <= kMaxProbeTasks, "opgym_internal::parallel_probe: n must be 1 to ", kMaxProbeTasks,
                    " tasks, got ", n);
  std::mutex m;
  std::set<std::thread::id> ids;
  executor().parallel_for(n, 1, [&](int64_t b, int64_t e) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(200 * (e - b))) {
    }  // long enough that one thread cannot take every task before the others start
    std::lock_guard<std::mutex> lk(m);
    ids.insert(std::this_thread::get_id());
  });
  return static_cast<int64_t>(ids.size());
}

// [limit, cached bytes, cached blocks, hits, misses]
std::vector<int64_t> output_cache_info() {
  const opgym_torch::OutputCacheInfo i = opgym_torch::BlockPool::info();
  return {i.limit_bytes, i.cached_bytes, i.cached_blocks, i.hits, i.misses};
}
void set_output_cache_limit(int64_t bytes) {
  OPGYM_CHECK_VALUE(bytes >= 0, "opgym: the output cache limit must be >= 0 bytes, got ", bytes);
  opgym_torch::BlockPool::set_limit(bytes);
}
void empty_output_cache() { opgym_torch::BlockPool::clear(); }

}  // namespace

// build_info takes no tensor: it is registered for every backend.
STABLE_TORCH_LIBRARY_IMPL(opgym, CompositeExplicitAutograd, m) { m.impl("build_info", TORCH_BOX(&build_info)); }

STABLE_TORCH_LIBRARY_IMPL(opgym_internal, CompositeExplicitAutograd, m) {
  m.impl("parallel_probe", TORCH_BOX(&parallel_probe));
  m.impl("output_cache_info", TORCH_BOX(&output_cache_info));
  m.impl("set_output_cache_limit", TORCH_BOX(&set_output_cache_limit));
  m.impl("empty_output_cache", TORCH_BOX(&empty_output_cache));
}
