// Rotary position embedding on q and k together: q_out = q * cos + rotate_half(q) * sin, the same for
// k, where rotate_half(x) = cat(-x[D/2:], x[:D/2]) over the last dim D (even).
//
// Numeric contract (src/ops/rotary/README.md): HF eager's two rotary functions, rounding for rounding.
//   mode hf   (text: apply_rotary_pos_emb): q, cos and sin of one dtype; q * cos, rotate_half(q) * sin
//             and their sum each rounded to that dtype (fp32 products and sum, RNE).
//   mode fp32 (vision: apply_rotary_pos_emb_vision): q, k, cos, sin upcast to fp32, the two products
//             and the sum in fp32, one rounding to q's dtype at the end.
// cos and sin are HF's [*, D] tables before the unsqueeze (rank of q minus one): `unsqueeze_dim`
// inserts the broadcast dim as HF's `cos.unsqueeze(unsqueeze_dim)` does, and every other dim must equal
// q's (and k's) or be 1. With mrope_section (three section lengths summing to D / 2), cos and sin carry
// a leading dim of 3 (PyPTO-Gym's MRoPE tables [3, ...]): element j of a row takes stream s(j), the
// index of the section holding j mod D/2 (Qwen2-VL's recomposition, done while loading: no recomposed
// table is materialized).
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

#include "opgym/parallel.hpp"
#include "opgym/tensor.hpp"

namespace opgym {

enum class RotaryMode { hf, fp32 };
RotaryMode parse_rotary_mode(std::string_view name);  // "hf" | "fp32"
const char* rotary_mode_name(RotaryMode m);

struct RotaryOptions {
  RotaryMode mode = RotaryMode::hf;
  int unsqueeze_dim = 1;                       // as HF's argument; negative counts from the end of q's rank
  std::array<int64_t, 3> mrope_section{};      // all zero: no MRoPE recomposition
  bool mrope() const { return mrope_section[0] || mrope_section[1] || mrope_section[2]; }
};

// Validates everything, then writes q_out and k_out. q_out may be q itself and k_out k itself (in
// place); any other overlap among what is written and what is read is refused. q and k: one dtype,
// the same rank and last dim (k may have fewer heads: GQA); q_out/k_out: q's/k's shape and dtype.
// Throws opgym::Error naming the argument; nothing is written on error.
void rotary(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
            const TensorView& q_out, const TensorView& k_out, const RotaryOptions& options = {},
            Executor* executor = nullptr);

namespace reference {
// Golden: HF's functions op by op on materialized intermediates (recompose, unsqueeze, q * cos,
// rotate_half(q), * sin, +, and the casts of the fp32 mode). Single-threaded, allocates.
void rotary_basic_ops(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
                      const TensorView& q_out, const TensorView& k_out, const RotaryOptions& options = {});
}  // namespace reference

}  // namespace opgym

// ---- CUDA (the backend: include/opgym/cuda.hpp, docs/CUDA.md) ---------------------------------
// Defined when the library was built with CUDA (OPGYM_HAVE_CUDA=1). No CUDA header is needed:
struct CUstream_st;  // cudaStream_t is `CUstream_st*`; nullptr is the legacy default stream

namespace opgym::cuda {

// rotary on the GPU (include/opgym/rotary.hpp's contract, the same bits as the CPU: elementwise, no
// sum order), enqueued on `stream`.
void rotary(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
            const TensorView& q_out, const TensorView& k_out, const RotaryOptions& options = {},
            CUstream_st* stream = nullptr);

}  // namespace opgym::cuda
