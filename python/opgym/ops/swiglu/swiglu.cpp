// opgym::swiglu's torch operators (src/ops/swiglu): schemas, CPU, Meta and Autograd kernels. CUDA
// kernels: swiglu_cuda.cpp; the checks both share: swiglu.hpp.
//
//   opgym::swiglu(Tensor gate, Tensor up, str activation="silu") -> Tensor
//       act(gate) * up (on these very views); activation "silu" or "gelu_tanh" (GeGLU)
//   opgym::swiglu_merged(Tensor gate_up, str activation="silu") -> Tensor
//       gate_up = [..., gate | up], gate standing for a separate (contiguous) gate_proj output
//   opgym::swiglu_mlp(Tensor x, Tensor w_gate_up, Tensor? b_gate_up, Tensor w_down, Tensor? b_down,
//                     str activation="silu") -> Tensor       down(swiglu_merged(x W^T + b)) + b_down
//
// The activation reproduces torch's silu or gelu(approximate="tanh") then mul bit for bit (on the CPU it passes torch's current
// intra-op thread count, which places the fp32 tails: include/opgym/swiglu.hpp). swiglu_mlp is
// CompositeImplicitAutograd over aten::linear: the GEMMs are torch's own, so their bits are what HF's
// would be for the same operands, and torch.compile sees linear + swiglu_merged + linear.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "csrc/output_cache.hpp"
#include "csrc/torch_common.hpp"
#include "opgym/opgym.hpp"
#include "ops/swiglu/swiglu.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

at::Tensor swiglu_cpu(const at::Tensor& gate, const at::Tensor& up, c10::string_view activation) {
  check_swiglu(gate, up, "swiglu");
  const opgym::GluActivation act = glu_activation(activation, "swiglu");
  // Contiguous, as torch's silu-then-mul gives it, from the cache of freed outputs: a fresh
  // [T, I] block would be page-faulted in on every call (output_cache.hpp; docs/PERF.md swiglu v3).
  at::Tensor out = empty_output(gate.sizes(), gate.scalar_type());
  translate_errors("swiglu", [&] {
    opgym::swiglu(view_of(gate), view_of(up), view_of(out), swiglu_options(opgym::GateLayout::as_given, act),
                  &aten_executor());
  });
  return out;
}

at::Tensor swiglu_merged_cpu(const at::Tensor& gate_up, c10::string_view activation) {
  check_swiglu_merged(gate_up, "swiglu_merged");
  const opgym::GluActivation act = glu_activation(activation, "swiglu_merged");
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() /= 2;
  at::Tensor out = empty_output(shape, gate_up.scalar_type());
  translate_errors("swiglu_merged", [&] {
    opgym::swiglu_merged(view_of(gate_up), view_of(out), swiglu_options(opgym::GateLayout::contiguous, act),
                         &aten_executor());
  });
  return out;
}

at::Tensor swiglu_meta(const at::Tensor& gate, const at::Tensor& up, c10::string_view activation) {
  check_swiglu(gate, up, "swiglu");
  glu_activation(activation, "swiglu");
  return at::empty_symint(gate.sym_sizes(), gate.options());  // contiguous, as the CPU and CUDA kernels
}

at::Tensor swiglu_merged_meta(const at::Tensor& gate_up, c10::string_view activation) {
  check_swiglu_merged(gate_up, "swiglu_merged");
  glu_activation(activation, "swiglu_merged");
  return swiglu_merged_out(gate_up);
}

at::Tensor swiglu_autograd(c10::DispatchKeySet ks, const at::Tensor& gate, const at::Tensor& up,
                           c10::string_view activation) {
  TORCH_CHECK(!grad_needed({&gate, &up}),
              "opgym::swiglu has no backward (an inference kernel); call it under torch.no_grad(), or use HF's own "
              "MLP where gradients are needed (opgym.patch does so by itself)");
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::swiglu", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.redispatch(ks & c10::after_autograd_keyset, gate, up, activation);
}

at::Tensor swiglu_merged_autograd(c10::DispatchKeySet ks, const at::Tensor& gate_up, c10::string_view activation) {
  TORCH_CHECK(!grad_needed({&gate_up}),
              "opgym::swiglu_merged has no backward (an inference kernel); call it under torch.no_grad()");
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::swiglu_merged", "")
                       .typed<at::Tensor(const at::Tensor&, c10::string_view)>();
  return op.redispatch(ks & c10::after_autograd_keyset, gate_up, activation);
}

at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& w_gate_up, const c10::optional<at::Tensor>& b_gate_up,
                      const at::Tensor& w_down, const c10::optional<at::Tensor>& b_down, c10::string_view activation) {
  check_tensor_arg(x, "x", "swiglu_mlp");
  glu_activation(activation, "swiglu_mlp");
  check_tensor_arg(w_gate_up, "w_gate_up", "swiglu_mlp");
  check_tensor_arg(w_down, "w_down", "swiglu_mlp");
  TORCH_CHECK_VALUE(w_gate_up.dim() == 2 && w_down.dim() == 2, "opgym::swiglu_mlp: w_gate_up [2 * I, H] and w_down "
                    "[H_out, I] must be 2-D, got ", w_gate_up.sym_sizes(), " and ", w_down.sym_sizes());
  OPGYM_SYM_CHECK_VALUE(w_gate_up.sym_size(1).sym_eq(x.sym_size(-1)), "opgym::swiglu_mlp: w_gate_up's in-features "
                        "must equal x's last dim ", x.sym_size(-1), ", got ", w_gate_up.sym_sizes());
  OPGYM_SYM_CHECK_VALUE((w_gate_up.sym_size(0) % 2).sym_eq(0), "opgym::swiglu_mlp: w_gate_up's rows hold gate then "
                        "up and must be even (2 * I), got ", w_gate_up.sym_sizes());
  OPGYM_SYM_CHECK_VALUE((w_gate_up.sym_size(0) / 2).sym_eq(w_down.sym_size(1)), "opgym::swiglu_mlp: w_down's "
                        "in-features must equal I = ", w_gate_up.sym_size(0) / 2, ", got ", w_down.sym_sizes());
  auto check_bias = [](const c10::optional<at::Tensor>& b, const char* name, const c10::SymInt& len) {
    if (!b.has_value()) return;
    TORCH_CHECK_VALUE(b->dim() == 1, "opgym::swiglu_mlp: ", name, " must be [", len, "], got ", b->sym_sizes());
    OPGYM_SYM_CHECK_VALUE(b->sym_size(0).sym_eq(len), "opgym::swiglu_mlp: ", name, " must be [", len, "], got ",
                          b->sym_sizes());
  };
  check_bias(b_gate_up, "b_gate_up", w_gate_up.sym_size(0));
  check_bias(b_down, "b_down", w_down.sym_size(0));
  static auto merged = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::swiglu_merged", "")
                           .typed<at::Tensor(const at::Tensor&, c10::string_view)>();
  return at::linear(merged.call(at::linear(x, w_gate_up, b_gate_up), activation), w_down, b_down);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opgym, m) {
  m.def("swiglu(Tensor gate, Tensor up, str activation=\"silu\") -> Tensor", {at::Tag::pt2_compliant_tag});
  m.def("swiglu_merged(Tensor gate_up, str activation=\"silu\") -> Tensor", {at::Tag::pt2_compliant_tag});
  m.def("swiglu_mlp(Tensor x, Tensor w_gate_up, Tensor? b_gate_up, Tensor w_down, Tensor? b_down, "
        "str activation=\"silu\") -> Tensor",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("swiglu", &swiglu_cpu);
  m.impl("swiglu_merged", &swiglu_merged_cpu);
}
TORCH_LIBRARY_IMPL(opgym, Meta, m) {
  m.impl("swiglu", &swiglu_meta);
  m.impl("swiglu_merged", &swiglu_merged_meta);
}
TORCH_LIBRARY_IMPL(opgym, Autograd, m) {
  m.impl("swiglu", &swiglu_autograd);
  m.impl("swiglu_merged", &swiglu_merged_autograd);
}
TORCH_LIBRARY_IMPL(opgym, CompositeImplicitAutograd, m) { m.impl("swiglu_mlp", &swiglu_mlp); }
