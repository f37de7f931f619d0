// RMSNorm: y = x / sqrt(mean(x^2 over the last dim) + eps) * weight.
//
// Numeric contract (the whole story is in src/ops/rms_norm/README.md):
//   mode hf (default) - HF eager LlamaRMSNorm/Qwen2RMSNorm, rounding for rounding:
//       x32 = float(x); var = sum(x32*x32) / D (fp32, products rounded, no FMA);
//       r = 1 / sqrt(var + float(eps)); h = round_to(x.dtype, x32 * r);
//       y = round_to(out dtype, float(weight) * float(h)).
//   mode fp32 - everything in fp32, one rounding at the end: y = round_to(out, (x32 * r) * w32).
//   weight_offset (Gemma) uses (1 + w) in fp32 in place of w, in both modes.
// The out dtype is torch's promotion of (weight dtype, x dtype). Rounding is round-to-nearest-even;
// NaN stays NaN. The fp32 sum of squares follows one order (SumOrder) on every CPU path (scalar,
// AVX2, AVX-512), so every path gives the same bits; by default it is torch's own CPU order, so the
// output equals HF eager's on the CPU bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "opgym/cpu.hpp"
#include "opgym/parallel.hpp"
#include "opgym/tensor.hpp"

namespace opgym {

enum class NormMode { hf, fp32 };

// The order of the fp32 sum of squares: the one freedom the contract leaves.
//   torch_cpu  torch's own CPU `sum` (cascade_sum in ATen's SumKernel.cpp, 8-float vectors, 4-way
//              ILP, 4 cascade levels): with it the CPU output equals HF eager's bits on CPU.
//   lanes64    element i into partial i mod 64, the 64 partials folded by halves: the CUDA kernels'
//              order (a warp's lanes), offered on the CPU so the GPU can be checked bit for bit.
//   automatic  torch_cpu on the CPU, lanes64 on CUDA.
enum class SumOrder { automatic, torch_cpu, lanes64 };
const char* sum_order_name(SumOrder o);
const char* mode_name(NormMode m);
NormMode parse_mode(std::string_view name);  // "hf" | "fp32"

struct RmsNormOptions {
  double eps = 1e-6;
  NormMode mode = NormMode::hf;
  bool weight_offset = false;  // Gemma: scale by (1 + weight)
  SumOrder sum_order = SumOrder::automatic;
};

// SumOrder::lanes64: element i of a row adds into partial sum (i mod kSumLanes), in order of i; the
// kSumLanes partials are then folded by halves (p[j] += p[j + n], n = 32, 16, ..., 1).
constexpr int kSumLanes = 64;

// Out dtype for a given (x, weight) pair, as torch promotes `weight * x.to(x.dtype)`.
inline DType rms_norm_out_dtype(DType x, DType weight) { return promote(weight, x); }

// The tile plan, derived at run time from (rank, shape, strides, dtype); nothing is declared ahead.
// Leading dims are flattened into rows (one row stride when they collapse, else an index walk),
// rows are grouped into row blocks of roughly kBlockBytes, blocks are spread over threads; the last
// dim is handled whole: a vector body of `vector_elems`-wide steps and a masked or scalar tail.
struct RmsNormPlan {
  int64_t rows = 0;          // product of the leading dims
  int64_t dim = 0;           // last dim, normalized whole
  bool rows_collapse = true; // leading dims are one uniform stride (x and out)
  int64_t row_block = 0;     // rows per task
  int64_t blocks = 0;        // tasks
  int threads = 1;           // workers the call may use
  CpuIsa isa = CpuIsa::scalar;
  int vector_elems = 1;      // elements per vector step on this ISA
  int64_t vector_body = 0;   // elements of a row covered by full vector steps
  int64_t tail = 0;          // elements left for the tail
  int64_t batch_rows = 1;    // short rows are processed this many at a time
  bool overlapped = false;   // long streamed rows: pass 2 of a row runs inside pass 1 of the next (torch's sum order)
  std::string_view conversions;  // how dtype conversions are done on this path (static text, no allocation)
  DType x_dtype = DType::float32, w_dtype = DType::float32, out_dtype = DType::float32;
  std::string describe() const;  // multi-line, for `opgym explain`
};

// Plans a call without running it (validates x only). `threads` 0 means the default executor's.
RmsNormPlan plan_rms_norm(const TensorView& x, DType weight_dtype, int threads = 0);

// Validates everything, then normalizes. `out` may be `x` itself (same data and strides); any other
// overlap is refused. Throws opgym::Error naming the argument; nothing is written on error.
void rms_norm(const TensorView& x, const TensorView& weight, const TensorView& out,
              const RmsNormOptions& options = {}, Executor* executor = nullptr);

namespace reference {
// Golden (a): HF's eager sequence op by op with materialized fp32 intermediates
// (cast, pow, mean, add, rsqrt, mul, cast, mul), summing in options.sum_order. Also the unfused
// baseline for speed comparisons. Single-threaded, allocates. Supports both modes.
void rms_norm_basic_ops(const TensorView& x, const TensorView& weight, const TensorView& out,
                        const RmsNormOptions& options = {});
// Golden (b): float64 throughout, for error analysis; writes doubles to out64 (contiguous, numel).
void rms_norm_f64(const TensorView& x, const TensorView& weight, double* out64,
                  const RmsNormOptions& options = {});
}  // namespace reference

}  // namespace opgym

// ---- CUDA (the backend: include/opgym/cuda.hpp, docs/CUDA.md) ---------------------------------
// Defined when the library was built with CUDA (OPGYM_HAVE_CUDA=1). No CUDA header is needed:
struct CUstream_st;  // cudaStream_t is `CUstream_st*`; nullptr is the legacy default stream

namespace opgym::cuda {

// The strategy a call uses, derived from the shape, dtypes and pointer alignment (nothing is
// declared ahead). Pure host logic: it runs without a GPU.
enum class RmsNormKernel {
  warp_rows,         // one warp per row, 4 rows per block, the row held in registers (dim <= 2048)
  block_row_smem,    // one block per row, the row staged in shared memory: one read, one write
  block_row_global,  // one block per row when the row exceeds shared memory: x is read twice
};
const char* kernel_name(RmsNormKernel k);

struct RmsNormPlan {
  RmsNormKernel kernel = RmsNormKernel::warp_rows;
  int64_t rows = 0, dim = 0;
  bool rows_collapse = true;  // leading dims collapse to one row stride (x and out)
  // warp_rows: elements each lane loads per access (2 when x, weight and out are all aligned to two
  // elements on every row, else 1), and the register capacity per lane (4, 16 or 64 elements).
  // block_row_*: the 16-byte vector width of x (elements); the per-row scalar prefix up to the
  // first aligned element and the scalar tail are computed on the device from each row's address.
  int vec = 1;
  int elems_per_lane = 0;
  int threads = 0;           // per block
  int64_t blocks = 0;        // grid; blocks loop over rows when rows exceed it
  size_t smem_bytes = 0;     // dynamic shared memory per block
  std::string describe() const;
};

// `max_smem_bytes`: the device's opt-in shared memory per block (0: assume 48 KiB, the default).
// Validates x only (as the CPU planner does).
RmsNormPlan plan_rms_norm(const TensorView& x, const TensorView& weight, const TensorView& out,
                          size_t max_smem_bytes = 0);

// RMSNorm on the GPU, enqueued on `stream`; returns without waiting. Same contract as
// opgym::rms_norm (hf order by default; the fp32 sum of squares uses the kSumLanes order, so the
// result is bit-identical to the CPU path on finite inputs). `out` may be `x` itself.
// Argument errors throw opgym::Error with the CPU front's messages before anything is launched;
// a failed launch throws std::runtime_error naming the CUDA error. Safe to capture in a CUDA graph:
// no allocation, no synchronization, no host-device copies.
void rms_norm(const TensorView& x, const TensorView& weight, const TensorView& out,
              const RmsNormOptions& options = {}, CUstream_st* stream = nullptr);

}  // namespace opgym::cuda
