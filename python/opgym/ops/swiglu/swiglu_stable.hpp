// opgym::swiglu's argument checks on torch's stable ABI and the merged form's output shape, shared by its
// CPU kernels (swiglu.cpp) and CUDA kernels (swiglu_cuda.cpp).
#pragma once

#include <string>
#include <vector>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"

namespace opgym_stable {

inline void check_swiglu(const Tensor& gate, const Tensor& up, const char* op) {
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

inline void check_swiglu_merged(const Tensor& gate_up, const char* op) {
  check_tensor_arg(gate_up, "gate_up", op);
  OPGYM_CHECK_VALUE(gate_up.dim() >= 1 && gate_up.dim() <= opgym::kMaxRank, "opgym::", op,
                    ": gate_up must have rank 1 to ", opgym::kMaxRank, ", got ", sizes_of(gate_up));
  OPGYM_CHECK_VALUE(gate_up.size(-1) % 2 == 0, "opgym::", op,
                    ": gate_up's last dim holds gate then up and must be even (2 * I), got ", sizes_of(gate_up));
}

// The schemas' `str activation`: "silu" (SwiGLU) or "gelu_tanh" (GeGLU: torch's gelu(approximate="tanh")).
inline opgym::GluActivation glu_activation(const std::string& s, const char* op) {
  if (s == "silu") return opgym::GluActivation::silu;
  if (s == "gelu_tanh") return opgym::GluActivation::gelu_tanh;
  value_error("opgym::", op, ": activation must be \"silu\" or \"gelu_tanh\", got \"", s, "\"");
}

// swiglu_merged's output: gate_up's shape with the last dim halved.
inline std::vector<int64_t> swiglu_merged_shape(const Tensor& gate_up) {
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() /= 2;
  return shape;
}

}  // namespace opgym_stable
