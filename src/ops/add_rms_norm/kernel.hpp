// What the add_rms_norm front hands the per-ISA CPU kernels: the residual add of one validated call,
// flattened to rows. The normalization that follows reuses RMSNorm's row kernels (ops/rms_norm).
#pragma once
#include <cstdint>

#include "opgym/cpu.hpp"
#include "opgym/rms_norm.hpp"
#include "opgym/tensor.hpp"

namespace opgym::detail {

struct AddRowsJob {
  const char* x = nullptr;   // base pointers (bytes)
  const char* r = nullptr;
  char* s = nullptr;
  DType dtype = DType::float32;  // x, residual and the sum share it
  int64_t dim = 0;
  // Row r starts at offset(r) elements: r * stride when the leading dims collapse, else unravelled.
  bool collapse = true;
  int64_t x_row_stride = 0, r_row_stride = 0, s_row_stride = 0;
  int lead_rank = 0;
  int64_t lead_shape[kMaxRank] = {}, x_lead[kMaxRank] = {}, r_lead[kMaxRank] = {}, s_lead[kMaxRank] = {};

  void row_offsets(int64_t row, int64_t& xo, int64_t& ro, int64_t& so) const {
    if (collapse) { xo = row * x_row_stride; ro = row * r_row_stride; so = row * s_row_stride; return; }
    xo = ro = so = 0;
    for (int d = lead_rank - 1; d >= 0; --d) {
      const int64_t i = row % lead_shape[d];
      row /= lead_shape[d];
      xo += i * x_lead[d];
      ro += i * r_lead[d];
      so += i * s_lead[d];
    }
  }
};

// s = round_to(dtype, float(x) + float(r)) for rows [begin, end). One per instruction set, each in
// its own TU (the same "group of 64 floats" as RMSNorm's kernels: src/core/simd_*.hpp).
void add_rows_scalar(const AddRowsJob& job, int64_t begin, int64_t end);
void add_rows_avx2(const AddRowsJob& job, int64_t begin, int64_t end);
void add_rows_avx512(const AddRowsJob& job, int64_t begin, int64_t end);

// The front's argument checks, shared by the CPU and CUDA fronts (one order, one wording); nothing is
// written when they throw. Returns false when there is nothing to compute (no elements).
bool check_add_rms_norm_args(const TensorView& x, const TensorView& residual, const TensorView& weight,
                             const TensorView& out, const TensorView& sum_out, const RmsNormOptions& opt);
// The add's job for arguments the checks accepted.
AddRowsJob add_rows_job(const TensorView& x, const TensorView& residual, const TensorView& sum_out);

}  // namespace opgym::detail
