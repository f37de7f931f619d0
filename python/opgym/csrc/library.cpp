// The torch library itself: TORCH_LIBRARY(opgym) (build_info; every operator is defined by its op's
// binding, python/opgym/ops/<op>/<op>.cpp, with TORCH_LIBRARY_FRAGMENT) and TORCH_LIBRARY(opgym_internal),
// the test, benchmark and maintenance helpers: parallel_probe and the output cache's (an op may add
// its own with TORCH_LIBRARY_FRAGMENT(opgym_internal): rms_norm's bench_core).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "csrc/output_cache.hpp"
#include "csrc/torch_common.hpp"
#include "opgym/opgym.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

// How many distinct threads the core's executor inside torch really uses for n tasks: a build in
// which at::parallel_for's OpenMP pragma was compiled out would answer 1 whatever set_num_threads says.
constexpr int64_t kMaxProbeTasks = 4096;  // 200 us each: at most ~0.8 s of spinning on one thread
int64_t parallel_probe(int64_t n) {
  TORCH_CHECK_VALUE(n >= 1 && n <= kMaxProbeTasks, "opgym_internal::parallel_probe: n must be 1 to ", kMaxProbeTasks,
                    " tasks, got ", n);
  std::mutex m;
  std::set<std::thread::id> ids;
  aten_executor().parallel_for(n, 1, [&](int64_t b, int64_t e) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(200 * (e - b))) {
    }  // long enough that one thread cannot take every task before the others start
    std::lock_guard<std::mutex> lk(m);
    ids.insert(std::this_thread::get_id());
  });
  return static_cast<int64_t>(ids.size());
}

}  // namespace

// The public namespace holds the operators (each op's binding adds its own) and build_info, which
// lets Python ask what this build has without a pybind module.
TORCH_LIBRARY(opgym, m) {
  m.def("build_info() -> str", []() -> std::string {
    return std::string("opgym ") + opgym::kVersion + "; cpu isa " + opgym::isa_name(opgym::active_cpu_isa()) +
           "; cpu features: " + opgym::cpu_features() + "; swiglu exp: " + opgym::swiglu_exp_library() +
           "; cuda operators: " + (OPGYM_EXT_CUDA ? "yes" : "no");
  });
}

// Test, benchmark and maintenance helpers: a namespace of their own, so the public `opgym` one holds
// only operators (and build_info); each checks its counts.
TORCH_LIBRARY(opgym_internal, m) {
  m.def("parallel_probe(int n) -> int", &parallel_probe);
  // The functional operators' output cache (output_cache.hpp): [limit, cached bytes, cached blocks,
  // hits, misses]; a new limit in bytes (0: off); free every cached block.
  m.def("output_cache_info() -> int[]", []() -> std::vector<int64_t> {
    const OutputCacheInfo i = output_cache_info();
    return {i.limit_bytes, i.cached_bytes, i.cached_blocks, i.hits, i.misses};
  });
  m.def("set_output_cache_limit(int bytes) -> ()", [](int64_t bytes) {
    TORCH_CHECK_VALUE(bytes >= 0, "opgym: the output cache limit must be >= 0 bytes, got ", bytes);
    set_output_cache_limit(bytes);
  });
  m.def("empty_output_cache() -> ()", &empty_output_cache);
}
