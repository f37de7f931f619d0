// opgym::rms_norm's CPU kernels on torch's stable ABI (built into opgym/_stable.so; src/ops/rms_norm
// is the core). The schemas, fake kernels and autograd rules are Python (meta.py beside this file);
// the CUDA kernels are rms_norm_cuda.cpp (opgym/_stable_cuda.so); both run the checks of rms_norm_stable.hpp.
//
//   opgym::rms_norm(Tensor x, Tensor weight, float eps, str mode="hf", bool weight_offset=False) -> Tensor
//   opgym::rms_norm_out(Tensor x, Tensor weight, float eps, str norm_mode="hf", bool weight_offset=False, *,
//                       Tensor(a!) out) -> Tensor(a!)
//   opgym::rms_norm_(Tensor(a!) x, Tensor weight, float eps, str norm_mode="hf", bool weight_offset=False) -> Tensor(a!)
//
// The output dtype is torch's promotion of (weight, x), as HF's `weight * h.to(x.dtype)` gives it; the
// functional form returns a contiguous tensor of x's shape. Every bad argument raises a Python
// exception naming it (ValueError for values, RuntimeError for devices); nothing aborts.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"
#include "ops/rms_norm/rms_norm_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

void run_core(const Tensor& x, const Tensor& weight, const Tensor& out, double eps, const std::string& mode,
              bool weight_offset) {
  translate_errors("rms_norm", [&] {
    opgym::rms_norm(view_of(x), view_of(weight), view_of(out), rms_norm_options(eps, mode, weight_offset), &executor());
  });
}

Tensor rms_norm_cpu(Tensor x, Tensor weight, double eps, std::string mode, bool weight_offset) {
  const ScalarType out_dtype = check_rms_norm(x, weight, eps, mode);
  Tensor out = empty_output(x.sizes(), out_dtype);  // a freed output reused: block_pool.hpp
  run_core(x, weight, out, eps, mode, weight_offset);
  return out;
}

Tensor rms_norm_out_cpu(Tensor x, Tensor weight, double eps, std::string mode, bool weight_offset, Tensor out) {
  check_rms_norm_out(x, weight, out, check_rms_norm(x, weight, eps, mode));
  run_core(x, weight, out, eps, mode, weight_offset);
  return out;
}

Tensor rms_norm_inplace_cpu(Tensor x, Tensor weight, double eps, std::string mode, bool weight_offset) {
  check_rms_norm_in_place(x, weight, check_rms_norm(x, weight, eps, mode));
  run_core(x, weight, x, eps, mode, weight_offset);
  return x;
}

// For `opgym bench`: the C++ API timed in a C++ loop (no dispatcher, no allocation), the unfused
// basic-op golden, or the functional operator through torch's dispatcher from C++ ("dispatch": what a
// torch.ops call costs without the Python side). Returns the median over `samples` of nanoseconds per
// call, each sample ~sample_ms.
double bench_core(Tensor x, Tensor weight, double eps, std::string impl, int64_t samples, double sample_ms) {
  OPGYM_CHECK_VALUE(x.is_cpu() && weight.is_cpu(), "opgym::bench_core: CPU tensors only");
  const ScalarType out_dtype = check_rms_norm(x, weight, eps, "hf");
  OPGYM_CHECK_VALUE(impl == "fused" || impl == "basic_ops" || impl == "dispatch",
                    "opgym::bench_core: impl must be fused, basic_ops or dispatch");
  OPGYM_CHECK_VALUE(samples >= 1 && samples <= 1000, "opgym_internal::bench_core: samples must be 1 to 1000, got ",
                    samples);
  OPGYM_CHECK_VALUE(sample_ms > 0 && sample_ms <= 10000,
                    "opgym_internal::bench_core: sample_ms must be in (0, 10000], got ", sample_ms);
  const Tensor xc = torch::stable::contiguous(x);
  Tensor out = torch::stable::empty(x.sizes(), out_dtype);
  const opgym::TensorView xv = view_of(xc), wv = view_of(weight), ov = view_of(out);
  opgym::RmsNormOptions opt;
  opt.eps = eps;
  const int kind = impl == "fused" ? 0 : impl == "basic_ops" ? 1 : 2;
  auto dispatch = [&] {
    std::array<StableIValue, 5> stack{torch::stable::detail::from(xc), torch::stable::detail::from(weight),
                                      torch::stable::detail::from(eps), torch::stable::detail::from(std::string("hf")),
                                      torch::stable::detail::from(false)};
    STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher("opgym::rms_norm", "", stack.data(), TORCH_ABI_VERSION));
    (void)torch::stable::detail::to<Tensor>(stack[0]);  // the output, released
  };
  auto once = [&] {
    if (kind == 0) opgym::rms_norm(xv, wv, ov, opt, &executor());
    else if (kind == 1) opgym::reference::rms_norm_basic_ops(xv, wv, ov, opt);
    else dispatch();
  };
  using clock = std::chrono::steady_clock;
  once();
  auto t0 = clock::now();
  int64_t calls = 0;
  while (std::chrono::duration<double>(clock::now() - t0).count() < 0.005 || calls < 3) once(), ++calls;
  const double per = std::chrono::duration<double>(clock::now() - t0).count() / static_cast<double>(calls);
  const int64_t iters = std::max<int64_t>(1, static_cast<int64_t>(sample_ms * 1e-3 / std::max(per, 1e-9)));
  std::vector<double> ns;
  for (int64_t s = 0; s < samples; ++s) {
    t0 = clock::now();
    for (int64_t i = 0; i < iters; ++i) once();
    ns.push_back(std::chrono::duration<double, std::nano>(clock::now() - t0).count() / static_cast<double>(iters));
  }
  std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
  return ns[ns.size() / 2];
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("rms_norm", TORCH_BOX(&rms_norm_cpu));
  m.impl("rms_norm_out", TORCH_BOX(&rms_norm_out_cpu));
  m.impl("rms_norm_", TORCH_BOX(&rms_norm_inplace_cpu));
}

STABLE_TORCH_LIBRARY_IMPL(opgym_internal, CPU, m) { m.impl("bench_core", TORCH_BOX(&bench_core)); }
