// What the front (rms_norm.cpp) hands the per-ISA CPU kernels: one validated call, flattened to rows.
#pragma once
#include <cstdint>

#include "opgym/rms_norm.hpp"

namespace opgym::detail {

struct RmsNormJob {
  const char* x = nullptr;   // base pointers (bytes)
  const char* w = nullptr;
  char* out = nullptr;
  DType x_dtype{}, w_dtype{}, out_dtype{};
  NormMode mode = NormMode::hf;
  bool weight_offset = false;
  bool native_bf16 = false;
  bool torch_order = true;   // SumOrder::torch_cpu, else lanes64
  bool stream_out = false;   // non-temporal stores for 64-byte-aligned output rows (huge outputs)
  bool overlap = false;      // pass 2 of a row inside pass 1 of the next (rows streamed from L3/memory)
  float eps = 0.f;           // already rounded to fp32, as torch adds it to an fp32 tensor
  int64_t dim = 0;
  // Row addressing: row r starts at x + offset(r) elements. When the leading dims collapse to one
  // stride, offset(r) = r * stride; otherwise r is unravelled over the leading dims.
  bool collapse = true;
  int64_t x_row_stride = 0, out_row_stride = 0;
  int lead_rank = 0;
  int64_t lead_shape[kMaxRank] = {}, x_lead_strides[kMaxRank] = {}, out_lead_strides[kMaxRank] = {};

  void row_offsets(int64_t r, int64_t& xo, int64_t& oo) const {
    if (collapse) { xo = r * x_row_stride; oo = r * out_row_stride; return; }
    xo = oo = 0;
    for (int d = lead_rank - 1; d >= 0; --d) {
      const int64_t i = r % lead_shape[d];
      r /= lead_shape[d];
      xo += i * x_lead_strides[d];
      oo += i * out_lead_strides[d];
    }
  }
};

// Short rows are normalized in batches (all sums, then all sqrt/divides, then all scaling) so their
// serial per-row latencies overlap; a batch's inputs stay within L1.
// Outputs at least this large are written with non-temporal stores: they cannot stay cached for the
// next op anyway, and the stores then skip the read-for-ownership of every output line.
constexpr int64_t kStreamOutBytes = int64_t{32} << 20;
constexpr int kRowBatch = 16;
constexpr int64_t kBatchBytes = 16 * 1024;
inline int batch_rows(int64_t dim, size_t elem_size) {
  const int64_t by_bytes = kBatchBytes / (dim * static_cast<int64_t>(elem_size) > 0 ? dim * static_cast<int64_t>(elem_size) : 1);
  return static_cast<int>(by_bytes < 1 ? 1 : by_bytes > kRowBatch ? kRowBatch : by_bytes);
}

// The front's argument checks, shared by the CPU and CUDA fronts (one order, one wording); nothing is
// written when they throw. Returns false when there is nothing to compute (no elements).
bool check_rms_norm_args(const TensorView& x, const TensorView& weight, const TensorView& out, const RmsNormOptions& opt);

// Normalizes rows [begin, end) of the job. One per instruction set; each lives in its own TU.
void rms_norm_rows_scalar(const RmsNormJob& job, int64_t begin, int64_t end);
void rms_norm_rows_avx2(const RmsNormJob& job, int64_t begin, int64_t end);
void rms_norm_rows_avx512(const RmsNormJob& job, int64_t begin, int64_t end);
using RmsNormRowsFn = void (*)(const RmsNormJob&, int64_t, int64_t);
RmsNormRowsFn rms_norm_rows_fn(CpuIsa isa);

// For ops built on RMSNorm (add_rms_norm): the plan of a view already checked, and the job of a call
// whose arguments check_rms_norm_args accepted (x is what is normalized, out where it goes).
RmsNormPlan rms_norm_plan_of_checked(const TensorView& x, DType weight_dtype, int threads);
RmsNormJob rms_norm_job(const TensorView& x, const TensorView& weight, const TensorView& out, const RmsNormOptions& opt,
                        const RmsNormPlan& plan);

// Each path's vector fp32 -> dtype rounding (n a multiple of 64), for tests.
void round_f32_scalar(DType to, const float* in, void* out, int64_t n);
void round_f32_avx2(DType to, const float* in, void* out, int64_t n);
void round_f32_avx512(DType to, const float* in, void* out, int64_t n);
// The AVX-512 all-bf16 layout's store and round trip, for tests. Variant 0: the exact integer
// rounding; 1: the native path (AVX512-BF16 store, Veltkamp's split); 2: the native path for rows
// without zeros (the FMA split).
void round_bf16_avx512_split(int variant, const float* in, uint16_t* stored, float* round_tripped, int64_t n);
// Whether the AVX-512 path may use AVX512-BF16 (the CPU has it, and tests have not turned it off).
bool native_bf16_enabled();
void set_native_bf16(bool enabled);  // tests: exercise the exact integer rounding on any CPU
// The overlapped mode (RmsNormJob::overlap): -1 chosen by size (the default), 0 never, 1 always
// (tests: run every shape through it).
void set_overlap_mode(int mode);
// When a call takes the overlapped mode, left to size (measured, docs/PERF.md v23): rows of 8 KiB or
// more once a thread has 1 MiB of input (beyond its L2), rows of 4 KiB from 8 MiB per thread; shorter
// rows, and less input, are faster in row batches.
constexpr int64_t kOverlapLongRowBytes = 8 * 1024, kOverlapLongBytesPerThread = int64_t{1} << 20;
constexpr int64_t kOverlapRowBytes = 4 * 1024, kOverlapBytesPerThread = int64_t{8} << 20;

}  // namespace opgym::detail
