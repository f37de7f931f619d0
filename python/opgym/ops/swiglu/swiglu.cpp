// opgym::swiglu's CPU kernels on torch's stable ABI (built into opgym/_stable.so; src/ops/swiglu is the
// core). Schemas, fake kernels, autograd rules and swiglu_mlp (a composite: linear, swiglu_merged,
// linear) are Python: meta.py beside this file. CUDA kernels: swiglu_cuda.cpp (opgym/_stable_cuda.so; both
// run the checks of swiglu_stable.hpp).
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
#include "ops/swiglu/swiglu_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

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
  Tensor out = empty_output(swiglu_merged_shape(gate_up), gate_up.scalar_type());
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
