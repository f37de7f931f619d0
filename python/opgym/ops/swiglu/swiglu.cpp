// opgym::swiglu's CPU kernels on torch's stable ABI (built into opgym/_stable.so; src/ops/swiglu is the
// core). Schemas, fake kernels, autograd rules and swiglu_mlp (a composite: linear, swiglu_merged,
// linear) are Python: meta.py beside this file. CUDA kernels: swiglu_cuda.cpp (per-torch library, its
// checks in swiglu.hpp).
//
//   opgym::swiglu(Tensor gate, Tensor up, str activation="silu") -> Tensor
//       act(gate) * up (on these very views); activation "silu" or "gelu_tanh" (GeGLU)
//   opgym::swiglu_merged(Tensor gate_up, str activation="silu") -> Tensor
//       gate_up = [..., gate | up], gate standing for a separate (contiguous) gate_proj output
//
// The activation reproduces torch's silu or gelu(approximate="tanh") then mul bit for bit: the CPU
// kernels pass torch's current intra-op thread count, which places the fp32 tails
// (include/opgym/swiglu.hpp).
#include <string>
#include <vector>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

void check_swiglu(const Tensor& gate, const Tensor& up, const char* op) {
  check_tensor_arg(gate, "gate", op);
  check_tensor_arg(up, "up", op);
  OPGYM_CHECK_VALUE(gate.dim() >= 1 && gate.dim() <= opgym::kMaxRank, "opgym::", op, ": gate must have rank 1 to ",
                    opgym::kMaxRank, ", got ", sizes_of(gate));
  OPGYM_CHECK_VALUE(up.scalar_type() == gate.scalar_type(), "opgym::", op, ": up must have gate's dtype ",
                    dtype_name(gate.scalar_type()), ", got ", dtype_name(up.scalar_type()));
  const auto a = up.sizes(), b = gate.sizes();
  bool same = a.size() == b.size();
  for (size_t i = 0; same && i < a.size(); ++i) same = a[i] == b[i];
  OPGYM_CHECK_VALUE(same, "opgym::", op, ": up must have gate's shape ", sizes_of(gate), ", got ", sizes_of(up));
  check_device(up, "up", gate, "gate", op);
}

void check_swiglu_merged(const Tensor& gate_up, const char* op) {
  check_tensor_arg(gate_up, "gate_up", op);
  OPGYM_CHECK_VALUE(gate_up.dim() >= 1 && gate_up.dim() <= opgym::kMaxRank, "opgym::", op,
                    ": gate_up must have rank 1 to ", opgym::kMaxRank, ", got ", sizes_of(gate_up));
  OPGYM_CHECK_VALUE(gate_up.size(-1) % 2 == 0, "opgym::", op,
                    ": gate_up's last dim holds gate then up and must be even (2 * I), got ", sizes_of(gate_up));
}

// The schemas' `str activation`: "silu" (SwiGLU) or "gelu_tanh" (GeGLU: torch's gelu(approximate="tanh")).
opgym::GluActivation glu_activation(const std::string& s, const char* op) {
  if (s == "silu") return opgym::GluActivation::silu;
  if (s == "gelu_tanh") return opgym::GluActivation::gelu_tanh;
  value_error("opgym::", op, ": activation must be \"silu\" or \"gelu_tanh\", got \"", s, "\"");
}

// layout: how the activation this stands for saw gate (fp32 tails): swiglu(gate, up) works on the views
// it is given (a half of a [T, 2I] product: per-row tails, as HF's `.chunk(2, -1)`); swiglu_merged stands
// for HF's separate gate_proj output (a contiguous gate).
opgym::SwigluOptions options(opgym::GateLayout layout, opgym::GluActivation act) {
  opgym::SwigluOptions o;
  o.torch_threads = static_cast<int>(torch::stable::get_num_threads());
  o.gate_layout = layout;
  o.activation = act;
  return o;
}

Tensor swiglu_cpu(Tensor gate, Tensor up, std::string activation) {
  check_swiglu(gate, up, "swiglu");
  const opgym::GluActivation act = glu_activation(activation, "swiglu");
  // Contiguous, as torch's silu-then-mul gives it, from the pool of freed outputs: a fresh [T, I]
  // block would be page-faulted in on every call (block_pool.hpp; docs/PERF.md swiglu v3).
  Tensor out = empty_output(gate.sizes(), gate.scalar_type());
  translate_errors("swiglu", [&] {
    opgym::swiglu(view_of(gate), view_of(up), view_of(out), options(opgym::GateLayout::as_given, act), &executor());
  });
  return out;
}

Tensor swiglu_merged_cpu(Tensor gate_up, std::string activation) {
  check_swiglu_merged(gate_up, "swiglu_merged");
  const opgym::GluActivation act = glu_activation(activation, "swiglu_merged");
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() /= 2;
  Tensor out = empty_output(shape, gate_up.scalar_type());
  translate_errors("swiglu_merged", [&] {
    opgym::swiglu_merged(view_of(gate_up), view_of(out), options(opgym::GateLayout::contiguous, act), &executor());
  });
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("swiglu", TORCH_BOX(&swiglu_cpu));
  m.impl("swiglu_merged", TORCH_BOX(&swiglu_merged_cpu));
}
