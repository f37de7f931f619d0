// What the attn_softmax front hands the per-ISA CPU kernels (and the CUDA launcher): one validated call
// as rows of scores, mask and out (leading dims unravelled per row), and, for the segmented form, where
// each row's scores sit.
#pragma once
#include <cstdint>

#include "opgym/attn_softmax.hpp"

namespace opgym::detail {

struct AttnSoftmaxJob {
  const char* scores = nullptr;
  const char* mask = nullptr;  // null: no mask
  char* out = nullptr;
  DType dtype = DType::float32;
  float scale = 1.0f;
  int64_t rows = 0, dim = 0;  // rows over the leading dims; dim = the last dim (W)
  int lead_rank = 0;
  int64_t lead_shape[kMaxRank] = {}, s_lead[kMaxRank] = {}, m_lead[kMaxRank] = {}, o_lead[kMaxRank] = {};
  // Segments (attn_softmax_segments): row r is p = r % period of its [P, W] matrix; its scores are columns
  // [c, c + len) with len the length of p's segment and c = 0, or the segment's start (block_diagonal).
  // Null cu: every row is one whole segment (len = dim, c = 0).
  const int64_t* cu = nullptr;
  int64_t segments = 0, period = 1;
  bool block_diagonal = false;

  void row_offsets(int64_t r, int64_t& so, int64_t& mo, int64_t& oo) const {
    so = mo = oo = 0;
    for (int d = lead_rank - 1; d >= 0; --d) {
      const int64_t i = r % lead_shape[d];
      r /= lead_shape[d];
      so += i * s_lead[d], mo += i * m_lead[d], oo += i * o_lead[d];
    }
  }
  // The segment of position p (cu[i] <= p < cu[i + 1]; empty segments skipped), and its columns [c, c + len).
  int64_t segment(int64_t p) const {
    int64_t lo = 0, hi = segments - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (cu[mid] <= p) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }
  void segment_span(int64_t i, int64_t& c, int64_t& len) const {
    len = cu[i + 1] - cu[i];
    c = block_diagonal ? cu[i] : 0;
  }
  // Row r's scores: columns [c, c + len) (the whole row without segments).
  void row_span(int64_t r, int64_t& c, int64_t& len) const {
    if (!cu) {
      c = 0, len = dim;
      return;
    }
    segment_span(segment(r % period), c, len);
  }
};

// Per-ISA rows [begin, end): `scratch` holds at least dim rounded up to 64 floats (per calling thread).
void attn_softmax_rows_scalar(const AttnSoftmaxJob& job, int64_t begin, int64_t end, float* scratch);
void attn_softmax_rows_avx2(const AttnSoftmaxJob& job, int64_t begin, int64_t end, float* scratch);
void attn_softmax_rows_avx512(const AttnSoftmaxJob& job, int64_t begin, int64_t end, float* scratch);
// The exp each path computes, y = exp(x) elementwise over n (a multiple of 64): for the tests.
void attn_softmax_exp_scalar(const float* x, float* y, int64_t n);
void attn_softmax_exp_avx2(const float* x, float* y, int64_t n);
void attn_softmax_exp_avx512(const float* x, float* y, int64_t n);
// The golden's exp for torch's build `isa` (golden.cpp): glibc's expf for scalar, Sleef's scalar u10 otherwise.
float attn_softmax_golden_exp(float x, CpuIsa isa);

// The front's checks and job, shared by the CPU and CUDA fronts. `cu` null: the plain form. Returns false
// when there is nothing to compute.
bool make_attn_softmax_job(const TensorView& scores, const TensorView& out, const AttnSoftmaxOptions& options,
                           const int64_t* cu, int64_t segments, bool block_diagonal, AttnSoftmaxJob& job);
// The torch build reproduced: options.torch_isa, else the active ISA; checked against the CPU.
CpuIsa attn_softmax_isa(const AttnSoftmaxOptions& options);

}  // namespace opgym::detail
