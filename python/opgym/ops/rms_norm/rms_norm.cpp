// opgym::rms_norm's torch operators (src/ops/rms_norm): schemas (TORCH_LIBRARY_FRAGMENT; the library
// itself is csrc/library.cpp), CPU kernels that call the C++ core on torch's intra-op thread pool, Meta
// kernels (shape + promoted dtype) for fake tensors / torch.compile, Autograd and ADInplaceOrView
// kernels, and opgym_internal::bench_core. CUDA kernels: rms_norm_cuda.cpp; shared checks: rms_norm.hpp.
//
//   opgym::rms_norm(Tensor x, Tensor weight, float eps, str mode="hf", bool weight_offset=False) -> Tensor
//   opgym::rms_norm_out(Tensor x, Tensor weight, float eps, str norm_mode="hf", bool weight_offset=False, *,
//                       Tensor(a!) out) -> Tensor(a!)
//   opgym::rms_norm_(Tensor(a!) x, Tensor weight, float eps, str norm_mode="hf", bool weight_offset=False) -> Tensor(a!)
//
// The output dtype is torch's promotion of (weight, x), as HF's `weight * h.to(x.dtype)` gives it; the
// functional form returns a contiguous tensor of x's shape. There is no backward formula: the ops are
// for inference. The functional op's Autograd kernel makes that explicit: its output is part of the
// graph, and backpropagating through it raises (rather than torch's default of a warning and silently
// missing gradients). opgym.patch runs the module's own forward whenever a gradient is needed.
// Every bad argument raises a Python exception naming it (ValueError for values, RuntimeError for
// devices); nothing aborts.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "csrc/output_cache.hpp"
#include "csrc/torch_common.hpp"
#include "opgym/opgym.hpp"
#include "ops/rms_norm/rms_norm.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

// Runs the core; opgym::Error (which names the argument) becomes a ValueError.
void run_core(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& out, double eps, c10::string_view mode,
              bool weight_offset) {
  translate_errors("rms_norm", [&] {
    opgym::rms_norm(view_of(x), view_of(weight), view_of(out), rms_norm_options(eps, mode, weight_offset),
                    &aten_executor());
  });
}

// ---- CPU ----------------------------------------------------------------------------------------

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                        bool weight_offset) {
  const at::ScalarType out_dtype = check_rms_norm(x, weight, eps, mode);
  check_rms_norm_weight_device(x, weight);
  at::Tensor out = empty_output(x.sizes(), out_dtype);  // a freed output reused: output_cache.hpp
  run_core(x, weight, out, eps, mode, weight_offset);
  return out;
}

at::Tensor& rms_norm_out_cpu(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                             bool weight_offset, at::Tensor& out) {
  check_rms_norm_out(x, weight, out, check_rms_norm(x, weight, eps, mode));
  run_core(x, weight, out, eps, mode, weight_offset);
  return out;
}

at::Tensor& rms_norm_inplace_cpu(at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                                 bool weight_offset) {
  check_rms_norm_in_place(x, weight, check_rms_norm(x, weight, eps, mode));
  run_core(x, weight, x, eps, mode, weight_offset);
  return x;
}

// ---- Meta (fake tensors, torch.compile): shapes and dtypes only, symbolic sizes allowed ----------

at::Tensor rms_norm_meta(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                         bool /*weight_offset*/) {
  const at::ScalarType out_dtype = check_rms_norm(x, weight, eps, mode);
  check_rms_norm_weight_device(x, weight);
  return at::empty_symint(x.sym_sizes(), x.options().dtype(out_dtype), at::MemoryFormat::Contiguous);
}

at::Tensor& rms_norm_out_meta(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                              bool /*weight_offset*/, at::Tensor& out) {
  check_rms_norm_out(x, weight, out, check_rms_norm(x, weight, eps, mode));
  return out;
}

at::Tensor& rms_norm_inplace_meta(at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view mode,
                                  bool /*weight_offset*/) {
  check_rms_norm_in_place(x, weight, check_rms_norm(x, weight, eps, mode));
  return x;
}

// ---- Autograd: no formula; backward raises a clear error ---------------------------------------

// The three operators' handles, looked up once.
using FunctionalFn = at::Tensor(const at::Tensor&, const at::Tensor&, double, c10::string_view, bool);
using OutFn = at::Tensor&(const at::Tensor&, const at::Tensor&, double, c10::string_view, bool, at::Tensor&);
using InplaceFn = at::Tensor&(at::Tensor&, const at::Tensor&, double, c10::string_view, bool);

c10::TypedOperatorHandle<FunctionalFn>& functional_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::rms_norm", "").typed<FunctionalFn>();
  return op;
}
c10::TypedOperatorHandle<OutFn>& out_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::rms_norm_out", "").typed<OutFn>();
  return op;
}
c10::TypedOperatorHandle<InplaceFn>& inplace_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::rms_norm_", "").typed<InplaceFn>();
  return op;
}

class RmsNormNoBackward : public torch::autograd::Function<RmsNormNoBackward> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& x, const at::Tensor& weight,
                            double eps, const std::string& mode, bool weight_offset) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return functional_op().call(x, weight, eps, mode, weight_offset);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list /*grads*/) {
    TORCH_CHECK(false,
                "opgym::rms_norm has no backward (an inference kernel); compute the norm with the module's own "
                "forward where gradients are needed (opgym.patch does so by itself)");
  }
};

at::Tensor rms_norm_autograd(c10::DispatchKeySet ks, const at::Tensor& x, const at::Tensor& weight, double eps,
                             c10::string_view mode, bool weight_offset) {
  // Inference (no_grad, or nothing requires grad): no autograd node, and straight on to the kernel
  // below autograd with the key set already computed (a fresh op.call would compute it again): this
  // hop is a tenth of a decode-sized call.
  if (!at::GradMode::is_enabled() || (!x.requires_grad() && !weight.requires_grad())) {
    return functional_op().redispatch(ks & c10::after_ADInplaceOrView_keyset, x, weight, eps, mode, weight_offset);
  }
  return RmsNormNoBackward::apply(x, weight, eps, std::string(mode.data(), mode.size()), weight_offset);
}

// The mutable forms have no autograd at all: where a gradient would be needed their Autograd
// kernels refuse at once (the fallback torch would otherwise use lets backward run through them
// silently wrong), else they go on below autograd. Their ADInplaceOrView kernels bump the version
// counter of the tensor they overwrite, as torch's own in-place and out= ops do, so autograd can tell
// that a tensor it saved was overwritten; that key is in every normal tensor's key set, so this holds
// under no_grad and inference_mode too (inference tensors have no version counter and skip it).
at::Tensor& rms_norm_out_autograd(c10::DispatchKeySet ks, const at::Tensor& x, const at::Tensor& weight, double eps,
                                  c10::string_view mode, bool weight_offset, at::Tensor& out) {
  TORCH_CHECK(!grad_needed({&x, &weight, &out}),
              "opgym::rms_norm_out has no autograd (out= forms never do); call it under torch.no_grad(), or use the "
              "module's own forward where gradients are needed");
  return out_op().redispatch(ks & c10::after_autograd_keyset, x, weight, eps, mode, weight_offset, out);
}

at::Tensor& rms_norm_inplace_autograd(c10::DispatchKeySet ks, at::Tensor& x, const at::Tensor& weight, double eps,
                                      c10::string_view mode, bool weight_offset) {
  TORCH_CHECK(!grad_needed({&x, &weight}),
              "opgym::rms_norm_ has no autograd (an inference kernel); call it under torch.no_grad(), or use the "
              "module's own forward where gradients are needed");
  return inplace_op().redispatch(ks & c10::after_autograd_keyset, x, weight, eps, mode, weight_offset);
}

at::Tensor& rms_norm_out_inplace_or_view(c10::DispatchKeySet ks, const at::Tensor& x, const at::Tensor& weight,
                                         double eps, c10::string_view mode, bool weight_offset, at::Tensor& out) {
  out_op().redispatch(ks & c10::after_ADInplaceOrView_keyset, x, weight, eps, mode, weight_offset, out);
  torch::autograd::impl::bump_version(out);
  return out;
}

at::Tensor& rms_norm_inplace_inplace_or_view(c10::DispatchKeySet ks, at::Tensor& x, const at::Tensor& weight, double eps,
                                             c10::string_view mode, bool weight_offset) {
  inplace_op().redispatch(ks & c10::after_ADInplaceOrView_keyset, x, weight, eps, mode, weight_offset);
  torch::autograd::impl::bump_version(x);
  return x;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opgym, m) {
  // Lvalues: an rvalue vector would bind to def's (schema, function) overload instead.
  const std::vector<at::Tag> out_tags = tags_with("out"), inplace_tags = tags_with("inplace");
  m.def("rms_norm(Tensor x, Tensor weight, float eps, str mode=\"hf\", bool weight_offset=False) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  // The mutable forms call the mode `norm_mode`: under torch.compile they are functionalized through
  // the auto_functionalized higher-order op, whose dispatch helper takes a parameter named `mode`
  // and so cannot be given an operator argument of that name (torch 2.13: "got multiple values for
  // argument 'mode'").
  m.def("rms_norm_out(Tensor x, Tensor weight, float eps, str norm_mode=\"hf\", bool weight_offset=False, *, "
        "Tensor(a!) out) -> Tensor(a!)",
        out_tags);
  m.def("rms_norm_(Tensor(a!) x, Tensor weight, float eps, str norm_mode=\"hf\", bool weight_offset=False) -> Tensor(a!)",
        inplace_tags);
}

TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("rms_norm_out", &rms_norm_out_cpu);
  m.impl("rms_norm_", &rms_norm_inplace_cpu);
}

TORCH_LIBRARY_IMPL(opgym, Autograd, m) {
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("rms_norm_out", &rms_norm_out_autograd);
  m.impl("rms_norm_", &rms_norm_inplace_autograd);
}

TORCH_LIBRARY_IMPL(opgym, ADInplaceOrView, m) {
  m.impl("rms_norm_out", &rms_norm_out_inplace_or_view);
  m.impl("rms_norm_", &rms_norm_inplace_inplace_or_view);
}

TORCH_LIBRARY_IMPL(opgym, Meta, m) {
  m.impl("rms_norm", &rms_norm_meta);
  m.impl("rms_norm_out", &rms_norm_out_meta);
  m.impl("rms_norm_", &rms_norm_inplace_meta);
}

namespace {
// For `opgym bench`: the C++ API timed in a C++ loop (no dispatcher, no allocation), or the unfused
// basic-op golden. Returns the median over `samples` of nanoseconds per call, each sample ~sample_ms.
double bench_core(const at::Tensor& x, const at::Tensor& weight, double eps, c10::string_view impl, int64_t samples,
                  double sample_ms) {
  TORCH_CHECK_VALUE(x.device().is_cpu() && weight.device().is_cpu(), "opgym::bench_core: CPU tensors only");
  check_rms_norm(x, weight, eps, "hf");
  TORCH_CHECK_VALUE(impl == "fused" || impl == "basic_ops" || impl == "dispatch",
                    "opgym::bench_core: impl must be fused, basic_ops or dispatch");
  TORCH_CHECK_VALUE(samples >= 1 && samples <= 1000, "opgym_internal::bench_core: samples must be 1 to 1000, got ", samples);
  TORCH_CHECK_VALUE(sample_ms > 0 && sample_ms <= 10000, "opgym_internal::bench_core: sample_ms must be in (0, 10000], got ",
                    sample_ms);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::promote_types(weight.scalar_type(), x.scalar_type())));
  const opgym::TensorView xv = view_of(xc), wv = view_of(weight), ov = view_of(out);
  opgym::RmsNormOptions opt;
  opt.eps = eps;
  // dispatch: the functional operator through torch's dispatcher from C++ (autograd hop, checks,
  // allocation, the kernel): what a torch.ops call costs without the Python side.
  auto& op = functional_op();
  const int kind = impl == "fused" ? 0 : impl == "basic_ops" ? 1 : 2;
  auto once = [&] {
    if (kind == 0) opgym::rms_norm(xv, wv, ov, opt, &aten_executor());
    else if (kind == 1) opgym::reference::rms_norm_basic_ops(xv, wv, ov, opt);
    else op.call(xc, weight, eps, "hf", false);
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

// The C++ API timed in C++ for `opgym bench` (opgym_internal: csrc/library.cpp).
TORCH_LIBRARY_FRAGMENT(opgym_internal, m) {
  m.def("bench_core(Tensor x, Tensor weight, float eps, str impl, int samples, float sample_ms) -> float", &bench_core);
}
