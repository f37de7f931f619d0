// opgym::add_rms_norm's torch operators (src/ops/add_rms_norm): schemas, CPU, Meta, Autograd and
// ADInplaceOrView kernels. CUDA kernels: add_rms_norm_cuda.cpp; the checks both share: add_rms_norm.hpp.
//
//   opgym::add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, str mode="hf",
//                       bool weight_offset=False) -> (Tensor out, Tensor sum)
//   opgym::add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps, str norm_mode="hf",
//                        bool weight_offset=False) -> ()       # residual <- sum, x <- normed
//
// sum = residual + x in x's dtype (HF's order: rounded before the norm), out = rms_norm(sum, weight)
// with torch's promotion of (weight, x). residual must have x's shape and dtype (a named ValueError
// otherwise). The in-place form returns nothing, so torch.compile functionalizes it through
// auto_functionalized; x and residual must not overlap. No backward: where a gradient would be
// needed the Autograd kernels refuse at the call (opgym.patch runs the layer's own code then).
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>

#include "csrc/output_cache.hpp"
#include "csrc/torch_common.hpp"
#include "opgym/opgym.hpp"
#include "ops/add_rms_norm/add_rms_norm.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps, c10::string_view mode,
                                                    bool weight_offset) {
  const at::ScalarType out_dtype = check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm");
  at::Tensor out = empty_output(x.sizes(), out_dtype);
  at::Tensor sum = empty_output(x.sizes(), x.scalar_type());
  translate_errors("add_rms_norm", [&] {
    opgym::add_rms_norm(view_of(x), view_of(residual), view_of(weight), view_of(out), view_of(sum),
                        add_rms_norm_options(eps, mode, weight_offset), &aten_executor());
  });
  return {out, sum};
}

void add_rms_norm_inplace_cpu(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps,
                              c10::string_view mode, bool weight_offset) {
  check_add_rms_norm_in_place(x, check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm_"));
  translate_errors("add_rms_norm_", [&] {
    opgym::add_rms_norm(view_of(x), view_of(residual), view_of(weight), view_of(x), view_of(residual),
                        add_rms_norm_options(eps, mode, weight_offset), &aten_executor());
  });
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_meta(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps, c10::string_view mode,
                                                     bool /*weight_offset*/) {
  const at::ScalarType out_dtype = check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm");
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(out_dtype), at::MemoryFormat::Contiguous),
          at::empty_symint(x.sym_sizes(), x.options(), at::MemoryFormat::Contiguous)};
}

void add_rms_norm_inplace_meta(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps,
                               c10::string_view mode, bool /*weight_offset*/) {
  check_add_rms_norm_in_place(x, check_add_rms_norm(x, residual, weight, eps, mode, "add_rms_norm_"));
}

using FunctionalFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                                        c10::string_view, bool);
using InplaceFn = void(at::Tensor&, at::Tensor&, const at::Tensor&, double, c10::string_view, bool);

c10::TypedOperatorHandle<FunctionalFn>& functional_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::add_rms_norm", "").typed<FunctionalFn>();
  return op;
}
c10::TypedOperatorHandle<InplaceFn>& inplace_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::add_rms_norm_", "").typed<InplaceFn>();
  return op;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_autograd(c10::DispatchKeySet ks, const at::Tensor& x,
                                                         const at::Tensor& residual, const at::Tensor& weight,
                                                         double eps, c10::string_view mode, bool weight_offset) {
  TORCH_CHECK(!grad_needed({&x, &residual, &weight}),
              "opgym::add_rms_norm has no backward (an inference kernel); call it under torch.no_grad(), or use the "
              "layer's own code where gradients are needed (opgym.patch does so by itself)");
  return functional_op().redispatch(ks & c10::after_autograd_keyset, x, residual, weight, eps, mode, weight_offset);
}

void add_rms_norm_inplace_autograd(c10::DispatchKeySet ks, at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                                   double eps, c10::string_view mode, bool weight_offset) {
  TORCH_CHECK(!grad_needed({&x, &residual, &weight}),
              "opgym::add_rms_norm_ has no autograd (an inference kernel); call it under torch.no_grad(), or use the "
              "layer's own code where gradients are needed");
  inplace_op().redispatch(ks & c10::after_autograd_keyset, x, residual, weight, eps, mode, weight_offset);
}

// Bumps the version counters of what the in-place form overwrites (as torch's own in-place ops do).
void add_rms_norm_inplace_or_view(c10::DispatchKeySet ks, at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                                  double eps, c10::string_view mode, bool weight_offset) {
  inplace_op().redispatch(ks & c10::after_ADInplaceOrView_keyset, x, residual, weight, eps, mode, weight_offset);
  torch::autograd::impl::bump_version(x);
  torch::autograd::impl::bump_version(residual);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opgym, m) {
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, str mode=\"hf\", bool weight_offset=False) "
        "-> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  // `norm_mode`, as rms_norm_'s: auto_functionalized's helper takes a parameter named `mode`.
  m.def("add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps, str norm_mode=\"hf\", "
        "bool weight_offset=False) -> ()",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("add_rms_norm", &add_rms_norm_cpu);
  m.impl("add_rms_norm_", &add_rms_norm_inplace_cpu);
}
TORCH_LIBRARY_IMPL(opgym, Meta, m) {
  m.impl("add_rms_norm", &add_rms_norm_meta);
  m.impl("add_rms_norm_", &add_rms_norm_inplace_meta);
}
TORCH_LIBRARY_IMPL(opgym, Autograd, m) {
  m.impl("add_rms_norm", &add_rms_norm_autograd);
  m.impl("add_rms_norm_", &add_rms_norm_inplace_autograd);
}
TORCH_LIBRARY_IMPL(opgym, ADInplaceOrView, m) { m.impl("add_rms_norm_", &add_rms_norm_inplace_or_view); }
