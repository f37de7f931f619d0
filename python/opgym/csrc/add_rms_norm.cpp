// opgym::add_rms_norm's torch operators (src/ops/add_rms_norm): schemas, CPU, Meta, Autograd and
// ADInplaceOrView kernels. CUDA kernels: add_rms_norm_cuda.cpp.
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

#include "opgym/opgym.hpp"
#include "output_cache.hpp"
#include "torch_common.hpp"

namespace opgym_torch {

// Checks that need no data (CPU, CUDA and Meta kernels): returns the normalized output's dtype.
at::ScalarType check_add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                                  c10::string_view mode, const char* op) {
  check_tensor_arg(x, "x", op);
  check_tensor_arg(residual, "residual", op);
  const opgym::DType xd = to_opgym_dtype(x.scalar_type(), "x", op);
  const opgym::DType wd = check_tensor_arg(weight, "weight", op);
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.dim() <= opgym::kMaxRank, "opgym::", op, ": x must have 1 to ", opgym::kMaxRank,
                    " dims, got ", x.dim());
  TORCH_CHECK_VALUE(residual.scalar_type() == x.scalar_type(), "opgym::", op, ": residual must have dtype ",
                    x.scalar_type(), " (x's: HF adds the residual in the activations' dtype), got ",
                    residual.scalar_type());
  check_same_shape(x, residual, "residual", op);
  TORCH_CHECK_VALUE(weight.dim() == 1, "opgym::", op, ": weight must be 1-D of size ", x.sym_size(-1),
                    " (the last dim of x), got shape ", weight.sym_sizes());
  OPGYM_SYM_CHECK_VALUE(weight.sym_size(0).sym_eq(x.sym_size(-1)), "opgym::", op, ": weight must have shape [",
                        x.sym_size(-1), "] (the last dim of x), got ", weight.sym_sizes());
  TORCH_CHECK_VALUE(mode == "hf" || mode == "fp32", "opgym::", op, ": mode must be 'hf' or 'fp32', got '", mode, "'");
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "opgym::", op, ": eps must be a finite number >= 0, got ", eps);
  check_device(residual, "residual", x.device(), op);
  check_device(weight, "weight", x.device(), op);
  return to_aten_dtype(opgym::rms_norm_out_dtype(xd, wd));
}

opgym::RmsNormOptions add_rms_norm_options(double eps, c10::string_view mode, bool weight_offset) {
  opgym::RmsNormOptions o;
  o.eps = eps;
  o.mode = opgym::parse_mode(std::string_view(mode.data(), mode.size()));
  o.weight_offset = weight_offset;
  return o;
}

void check_add_rms_norm_in_place(const at::Tensor& x, at::ScalarType out_dtype) {
  TORCH_CHECK_VALUE(out_dtype == x.scalar_type(), "opgym::add_rms_norm_: in place needs an output dtype equal to x's ",
                    x.scalar_type(), ", but the weight promotes it to ", out_dtype, "; use opgym::add_rms_norm");
}

}  // namespace opgym_torch

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
