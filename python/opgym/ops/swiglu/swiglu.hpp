// What opgym::swiglu's CPU binding (swiglu.cpp: schemas, CPU, Meta and Autograd kernels, swiglu_mlp)
// and its CUDA binding (swiglu_cuda.cpp) share: the checks that need no data and the core's options.
// Names carry the op's: every op's binding is linked into one library.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "csrc/torch_common.hpp"
#include "opgym/swiglu.hpp"

namespace opgym_torch {

// Checks that need no data (CPU, CUDA and Meta kernels); the core checks overlap before writing.
inline void check_swiglu(const at::Tensor& gate, const at::Tensor& up, const char* op) {
  check_tensor_arg(gate, "gate", op);
  check_tensor_arg(up, "up", op);
  TORCH_CHECK_VALUE(gate.dim() >= 1 && gate.dim() <= opgym::kMaxRank, "opgym::", op, ": gate must have rank 1 to ",
                    opgym::kMaxRank, ", got ", gate.sym_sizes());
  TORCH_CHECK_VALUE(up.scalar_type() == gate.scalar_type(), "opgym::", op, ": up must have gate's dtype ",
                    gate.scalar_type(), ", got ", up.scalar_type());
  TORCH_CHECK_VALUE(up.dim() == gate.dim(), "opgym::", op, ": up must have gate's shape ", gate.sym_sizes(), ", got ",
                    up.sym_sizes());
  for (int64_t d = 0; d < gate.dim(); ++d)
    OPGYM_SYM_CHECK_VALUE(up.sym_size(d).sym_eq(gate.sym_size(d)), "opgym::", op, ": up must have gate's shape ",
                          gate.sym_sizes(), ", got ", up.sym_sizes());
  check_device(up, "up", gate, "gate", op);
}

inline void check_swiglu_merged(const at::Tensor& gate_up, const char* op) {
  check_tensor_arg(gate_up, "gate_up", op);
  TORCH_CHECK_VALUE(gate_up.dim() >= 1 && gate_up.dim() <= opgym::kMaxRank, "opgym::", op,
                    ": gate_up must have rank 1 to ", opgym::kMaxRank, ", got ", gate_up.sym_sizes());
  OPGYM_SYM_CHECK_VALUE((gate_up.sym_size(-1) % 2).sym_eq(0), "opgym::", op,
                        ": gate_up's last dim holds gate then up and must be even (2 * I), got ", gate_up.sym_sizes());
}

inline at::Tensor swiglu_merged_out(const at::Tensor& gate_up) {
  std::vector<c10::SymInt> shape(gate_up.sym_sizes().begin(), gate_up.sym_sizes().end());
  shape.back() = shape.back() / 2;
  return at::empty_symint(shape, gate_up.options());
}

// layout: how the silu this stands for saw gate (fp32 tails). swiglu(gate, up) is torch's silu(gate) *
// up on the views it is given (a half of a [T, 2I] product: per-row tails, as HF's `.chunk(2, -1)`);
// swiglu_merged(gate_up) stands for HF's separate gate_proj output (a contiguous gate). CUDA ignores it.
inline opgym::SwigluOptions swiglu_options(opgym::GateLayout layout = opgym::GateLayout::contiguous,
                                           opgym::GluActivation act = opgym::GluActivation::silu) {
  opgym::SwigluOptions o;
  o.torch_threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  o.gate_layout = layout;
  o.activation = act;
  return o;
}

// The schemas' `str activation`: "silu" (SwiGLU) or "gelu_tanh" (GeGLU: torch's gelu(approximate="tanh")).
inline opgym::GluActivation glu_activation(c10::string_view s, const char* op) {
  if (s == "silu") return opgym::GluActivation::silu;
  if (s == "gelu_tanh") return opgym::GluActivation::gelu_tanh;
  TORCH_CHECK_VALUE(false, "opgym::", op, ": activation must be \"silu\" or \"gelu_tanh\", got \"", s, "\"");
}

}  // namespace opgym_torch
