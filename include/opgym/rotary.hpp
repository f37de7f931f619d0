// Rotary position embedding on q and k together, in one pass: the first R dims of each row (the
// rotary dim) are rotated pair by pair, out_a = a * cos_a - b * sin_a and out_b = b * cos_b + a * sin_b
// for each pair (a, b), and dims [R, D) are copied unchanged (HF's partial rotary: torch.cat with the
// pass-through part). How the pairs are formed (RotaryPairs) and how cos/sin are indexed (one value per
// element, or one per pair) are parameters: together they cover HF's rotate_half (Llama, GPT-NeoX, Phi-3),
// its interleaved rotate_half (Cohere, GLM, Ernie 4.5, Helium), GPT-OSS's halves with a half-width table,
// and DeepSeek-V3's apply_rotary_pos_emb_interleave (adjacent pairs in, halves out).
//
// Numeric contract (src/ops/rotary/README.md): HF eager's rotary functions, rounding for rounding.
//   mode hf   (apply_rotary_pos_emb and its kin): q, cos and sin of one dtype; each product and the
//             sum rounded to that dtype (fp32 products and sum, RNE).
//   mode fp32 (apply_rotary_pos_emb_vision, Cohere's, Ernie's, OLMo's with fp32 tables): q, k, cos, sin
//             upcast to fp32, the two products and the sum in fp32, one rounding to q's dtype at the end.
// cos and sin are HF's [*, W] tables before the unsqueeze (rank of q minus one): `unsqueeze_dim`
// inserts the broadcast dim as HF's `cos.unsqueeze(unsqueeze_dim)` does, and every other dim must equal
// q's (and k's) or be 1. W is the rotary dim R (one value per element) or R / 2 (pair_table: one value
// per pair, read by both of its elements). With mrope_section (three section lengths summing to R / 2;
// rotate_half pairs, per-element tables), cos and sin carry a leading dim of 3 (PyPTO-Gym's MRoPE
// tables [3, ...]): element j of a row takes stream s(j), the index of the section holding j mod R/2
// (Qwen2-VL's recomposition, done while loading: no recomposed table is materialized).
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

// Which dims of a row's first R form the pair (a, b) number j (j < R / 2), and where its outputs go.
enum class RotaryPairs {
  half,          // a = x[j], b = x[j + R/2], written in place of them: rotate_half (Llama, GPT-NeoX)
  interleaved,   // a = x[2j], b = x[2j + 1], written in place of them: the interleaved rotate_half
                 // (torch.stack((-x2, x1), -1).flatten(-2): Cohere, GLM, Ernie 4.5, Helium, GPT-J)
  deinterleave,  // a = x[2j], b = x[2j + 1], written to out[j] and out[j + R/2]: DeepSeek-V3's
                 // apply_rotary_pos_emb_interleave (cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin]))
};
RotaryPairs parse_rotary_pairs(std::string_view name);  // "half" | "interleaved" | "deinterleave"
const char* rotary_pairs_name(RotaryPairs p);

struct RotaryOptions {
  RotaryMode mode = RotaryMode::hf;
  int unsqueeze_dim = 1;                       // as HF's argument; negative counts from the end of q's rank
  std::array<int64_t, 3> mrope_section{};      // all zero: no MRoPE recomposition
  RotaryPairs pairs = RotaryPairs::half;
  // false: cos/sin hold one value per element, R wide (element i reads entry i; with interleaved pairs
  // HF's tables are then repeat_interleave'd); true: one value per pair, R / 2 wide (pair j reads entry
  // j for both of its elements: HF's cos[..., :W // 2].repeat_interleave(2), GPT-OSS's half tables).
  // deinterleave takes only pair tables.
  bool pair_table = false;
  bool mrope() const { return mrope_section[0] || mrope_section[1] || mrope_section[2]; }
};

// Validates everything, then writes q_out and k_out. q_out may be q itself and k_out k itself (in
// place, every pairing); any other overlap among what is written and what is read is refused. q and k:
// one dtype, the same rank and last dim D (k may have fewer heads: GQA); q_out/k_out: q's/k's shape and
// dtype. The rotary dim R (from cos's last dim) must be even, from 2 to D.
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
