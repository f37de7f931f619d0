// SwiGLU and GeGLU: out = act(gate) * up, act = silu or gelu(approximate="tanh"), and the MLP around it
// (Qwen2 / Llama / Qwen2.5-VL's down_proj(act_fn(gate_proj(x)) * up_proj(x)); Gemma's with GELUTanh).
//
// Numeric contract (src/ops/swiglu/README.md): HF eager's roundings on torch's CPU.
//   silu:       s = g / (1 + exp(-g)) in fp32 on g = float(gate), rounded to gate's dtype (torch's silu);
//   gelu_tanh:  s = (0.5 g) * (1 + tanh(beta * fma(kappa, g^3, g))) in fp32, rounded (torch's gelu, tanh
//               approximation: beta = float(sqrt(2/pi)), kappa = float(0.044715), g^3 = (g * g) * g);
//   mul:        out = round_to(dtype, s * float(up))                                 (torch's mul).
// exp / tanh are the ones torch's CPU kernel uses at that element: Sleef's u10 on its vector body (the
// AVX2 and AVX-512 paths), glibc's on the scalar tail of each inner-loop call (per parallel chunk and,
// for a strided view, per row: GateLayout) and everywhere on a CPU without AVX2 (opgym's scalar path,
// where gelu_tanh has no fma either: torch's DEFAULT build has none). silu: after rounding to bf16 or
// fp16 the two exps agree on every input (checked exhaustively by the tests), so only fp32 depends on
// where the tails fall. gelu_tanh: the two paths differ after rounding on 4 bf16 and 26 fp16 inputs,
// so 16-bit tails are placed too (torch's 16-bit vector step is twice fp32's). `torch_threads` says
// over how many chunks torch split the call (torch.get_num_threads() at the call); silu's chunks use
// torch's grain of 32768 elements, gelu's numel / threads above 16384 elements (GeluKernelImpl).
// CUDA (opgym::cuda::swiglu below): expf / tanhf and IEEE arithmetic, as torch's CUDA kernels.
#pragma once
#include <cstdint>

#include "opgym/parallel.hpp"
#include "opgym/tensor.hpp"

namespace opgym {

// How the activation this reproduces iterated gate (tails only: which elements torch's vectorized loop
// left to its scalar tail, and so to glibc's expf / tanhf).
enum class GateLayout : int {
  // As a contiguous tensor of gate's shape, whatever gate's strides: HF's separate gate_proj output
  // (and what a merged gate|up GEMM stands in for). One flat run per torch chunk.
  contiguous = 0,
  // torch's silu on this very view: TensorIterator coalesces gate's dims from the innermost while each
  // outer stride continues the inner block; where one does not (a half of a [.., 2I] product, HF's
  // `.chunk(2, dim=-1)`) its vectorized loop runs per row segment, each with its own scalar tail; an
  // innermost block that is not unit-stride has no vector body at all (every element glibc's).
  as_given = 1,
};

// What act(gate) is.
enum class GluActivation : int {
  silu = 0,       // torch's silu (SwiGLU)
  gelu_tanh = 1,  // torch's gelu(approximate="tanh") (GeGLU: Gemma's GELUTanh)
};
const char* glu_activation_name(GluActivation a);

struct SwigluOptions {
  int torch_threads = 1;  // torch's intra-op threads for the activation this reproduces (tails only)
  GateLayout gate_layout = GateLayout::contiguous;
  GluActivation activation = GluActivation::silu;
};

// out = act(gate) * up. gate, up, out: one dtype, one shape, any leading strides (the last dim
// contiguous). out may be gate or up itself (in place); any other overlap is refused. Throws
// opgym::Error naming the argument; nothing is written on error.
void swiglu(const TensorView& gate, const TensorView& up, const TensorView& out, const SwigluOptions& options = {},
            Executor* executor = nullptr);

// The merged form (vLLM's silu_and_mul): gate_up [..., 2 * I] holds gate in its first half and up
// in its second; out is [..., I]. gate_layout as_given: torch's activation on gate_up's first half as a view
// (HF's `gate, up = gate_up.chunk(2, dim=-1)`); contiguous: on a separate gate tensor.
void swiglu_merged(const TensorView& gate_up, const TensorView& out, const SwigluOptions& options = {},
                   Executor* executor = nullptr);

// The whole MLP: out = down(act(x W_gate^T + b_gate) * (x W_up^T + b_up)) W_down^T + b_down, each
// Linear as torch's (an fp32-accumulated GEMM, the bias added in fp32, one rounding to the dtype).
// x [..., H] (leading dims collapsing to one row stride), w_gate and w_up [I, H], w_down [H_out, I]
// (torch's Linear layout, rows with any stride), out [..., H_out]; biases 1-D or null. One dtype
// throughout. When w_up is the second half of the buffer w_gate starts (w_up.data == the row after
// w_gate's last, same row stride: the merged gate|up weight), gate and up come from one GEMM.
// The GEMMs are oneDNN's matmul (bf16 and fp32 as they are, fp16 widened to fp32), in the library
// opgym::mlp (target opgym_mlp); their summation order is oneDNN's, so the MLP matches HF within
// tolerance, not bit for bit. Throws opgym::Error if built without oneDNN (blas_available()).
struct SwigluMlpBiases {
  const TensorView* gate = nullptr;
  const TensorView* up = nullptr;
  const TensorView* down = nullptr;
};
void swiglu_mlp(const TensorView& x, const TensorView& w_gate, const TensorView& w_up, const TensorView& w_down,
                const TensorView& out, const SwigluMlpBiases& biases = {}, const SwigluOptions& options = {},
                Executor* executor = nullptr);
bool blas_available();
// The exp / tanh the CPU vector paths use: "sleef-u10" (torch's), or "glibc" when built without Sleef.
const char* swiglu_exp_library();

namespace reference {
// Golden: torch's ops one by one on materialized fp32 intermediates (silu: float(gate), -g, exp, 1 + e,
// g / (1 + e); gelu_tanh: g * g * g, the fma, * beta, tanh, 0.5 * g, 1 + t, the product; the rounding,
// the product with up), single-threaded, with the exp / tanh chosen per element by the rule above for
// the active CPU path. Same argument checks as the front.
void swiglu_basic_ops(const TensorView& gate, const TensorView& up, const TensorView& out,
                      const SwigluOptions& options = {});
// Golden MLP: separate fp32 GEMMs (oneDNN on inputs widened to fp32), biases, roundings, the
// golden activation, the down GEMM.
void swiglu_mlp_basic_ops(const TensorView& x, const TensorView& w_gate, const TensorView& w_up,
                          const TensorView& w_down, const TensorView& out, const SwigluMlpBiases& biases = {},
                          const SwigluOptions& options = {});
}  // namespace reference

}  // namespace opgym

// ---- CUDA (the backend: include/opgym/cuda.hpp, docs/CUDA.md) ---------------------------------
// Defined when the library was built with CUDA (OPGYM_HAVE_CUDA=1). No CUDA header is needed:
struct CUstream_st;  // cudaStream_t is `CUstream_st*`; nullptr is the legacy default stream

namespace opgym::cuda {

// swiglu on the GPU (include/opgym/swiglu.hpp's contract with torch's CUDA kernels: silu with expf
// and an IEEE divide, gelu_tanh with tanhf and an fma where nvcc contracts torch's, in fp32; the
// argument errors of the CPU front), enqueued on `stream`.
void swiglu(const TensorView& gate, const TensorView& up, const TensorView& out, CUstream_st* stream = nullptr,
            GluActivation activation = GluActivation::silu);
void swiglu_merged(const TensorView& gate_up, const TensorView& out, CUstream_st* stream = nullptr,
                   GluActivation activation = GluActivation::silu);

}  // namespace opgym::cuda
