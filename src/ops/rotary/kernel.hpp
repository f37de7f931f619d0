// What the rotary front hands the per-ISA CPU kernels: one validated call flattened to rows of q then
// rows of k, each row with its cos and sin rows (broadcast dims have stride 0), the rotary dim and the
// pairing, and, for MRoPE, the pairs cut into the three sections with the stream each reads.
#pragma once
#include <cstdint>

#include "opgym/rotary.hpp"

namespace opgym::detail {

struct RotaryTensor {  // q or k
  const char* in = nullptr;
  char* out = nullptr;
  int64_t rows = 0;
  int lead_rank = 0;
  int64_t lead_shape[kMaxRank] = {}, in_lead[kMaxRank] = {}, out_lead[kMaxRank] = {}, cos_lead[kMaxRank] = {},
          sin_lead[kMaxRank] = {};
  void row_offsets(int64_t r, int64_t& io, int64_t& oo, int64_t& co, int64_t& so) const {
    io = oo = co = so = 0;
    for (int d = lead_rank - 1; d >= 0; --d) {
      const int64_t i = r % lead_shape[d];
      r /= lead_shape[d];
      io += i * in_lead[d], oo += i * out_lead[d], co += i * cos_lead[d], so += i * sin_lead[d];
    }
  }
};

struct RotaryJob {
  RotaryTensor t[2];  // q, k
  const char* cos = nullptr;
  const char* sin = nullptr;
  DType x_dtype = DType::float32, cs_dtype = DType::float32;
  bool hf = true;
  // dim: the row (head dim D); rot: the rotary dim R (even, <= D); half: R / 2, the number of pairs.
  // Dims [rot, dim) are copied unless the row is rotated in place.
  int64_t dim = 0, rot = 0, half = 0;
  RotaryPairs pairs = RotaryPairs::half;
  bool pair_table = false;  // cos/sin entry j serves both elements of pair j (else element i reads entry i)
  // The pairs in segments [begin, begin + len), each reading cos/sin at an extra element offset
  // (the MRoPE stream's; one segment at offset 0 without MRoPE).
  int segments = 1;
  int64_t seg_begin[3] = {}, seg_len[3] = {}, seg_cos[3] = {}, seg_sin[3] = {};
};

// Rows [begin, end) of q's rows followed by k's. One per instruction set, each in its own TU.
void rotary_rows_scalar(const RotaryJob& job, int64_t begin, int64_t end);
void rotary_rows_avx2(const RotaryJob& job, int64_t begin, int64_t end);
void rotary_rows_avx512(const RotaryJob& job, int64_t begin, int64_t end);

// The front's checks and job, shared by the CPU and CUDA fronts. Returns false when there is nothing
// to compute (q and k both empty).
bool make_rotary_job(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
                     const TensorView& q_out, const TensorView& k_out, const RotaryOptions& opt, RotaryJob& job);

}  // namespace opgym::detail
