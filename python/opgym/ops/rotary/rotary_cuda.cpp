// opgym::rotary's CUDA kernels on torch's stable ABI (built into opgym/_stable_cuda.so; schemas, fake
// kernels and autograd rules: meta.py; the checks, options and outputs the CPU kernels use too:
// rotary_stable.hpp): opgym::cuda::rotary on torch's current stream of q's device; outputs from torch's
// caching allocator (CUDA graphs work). Unverified on a GPU.
#include <string>
#include <tuple>

#include "csrc/stable.hpp"
#include "csrc/stable_cuda.hpp"
#include "opgym/opgym.hpp"
#include "ops/rotary/rotary_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

void run(const char* op, const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin, const Tensor& qo,
         const Tensor& ko, int64_t unsqueeze_dim, const std::string& mode, const RotarySection& mrope_section,
         const std::string& pairs, bool pair_table) {
  const auto guard = device_guard(q);
  translate_errors(op, [&] {
    opgym::cuda::rotary(view_of(q), view_of(k), view_of(cos), view_of(sin), view_of(qo), view_of(ko),
                        rotary_options(unsqueeze_dim, mode, mrope_section, pairs, pair_table), current_stream(q));
  });
}

std::tuple<Tensor, Tensor> rotary_cuda(Tensor q, Tensor k, Tensor cos, Tensor sin, int64_t unsqueeze_dim,
                                       std::string mode, RotarySection mrope_section, std::string pairs,
                                       bool pair_table, bool contiguous) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary");
  Tensor qo = rotary_output(q, contiguous), ko = rotary_output(k, contiguous);
  run("rotary", q, k, cos, sin, qo, ko, unsqueeze_dim, mode, mrope_section, pairs, pair_table);
  return {qo, ko};
}

void rotary_inplace_cuda(Tensor q, Tensor k, Tensor cos, Tensor sin, int64_t unsqueeze_dim, std::string mode,
                         RotarySection mrope_section, std::string pairs, bool pair_table) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary_");
  run("rotary_", q, k, cos, sin, q, k, unsqueeze_dim, mode, mrope_section, pairs, pair_table);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CUDA, m) {
  m.impl("rotary", TORCH_BOX(&rotary_cuda));
  m.impl("rotary_", TORCH_BOX(&rotary_inplace_cuda));
}
