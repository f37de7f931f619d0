// Golden references for RMSNorm. Plain code, one op per loop, meant to be read against HF:
//
//   input_dtype = hidden_states.dtype
//   hidden_states = hidden_states.to(torch.float32)                           # cast
//   variance = hidden_states.pow(2).mean(-1, keepdim=True)                    # pow, mean
//   hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)  # add, rsqrt, mul
//   return self.weight * hidden_states.to(input_dtype)                        # cast, mul
//
// torch's CPU mean is sum then divide by the count; its rsqrt is 1 / sqrt; eps is added as fp32.
// The sum runs in options.sum_order: torch's own CPU order (default, below) or the 64-lane order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/checks.hpp"
#include "core/storage.hpp"
#include "opgym/rms_norm.hpp"

namespace opgym::reference {

namespace {

float load(const TensorView& t, int64_t off) { return load_as_f32(t.dtype, t.data, off); }
void store(const TensorView& t, int64_t off, float v) { store_from_f32(t.dtype, t.data, off, v); }
// Element offset of the start of row r (leading dims unravelled).
int64_t row_offset(const TensorView& t, int64_t r) {
  int64_t off = 0;
  for (int d = t.rank - 2; d >= 0; --d) {
    off += (r % t.shape[d]) * t.strides[d];
    r /= t.shape[d];
  }
  return off;
}
void check(const TensorView& x, const TensorView& w, const char* op) {
  detail::check_view(x, "x", op);
  detail::check_view(w, "weight", op);
  if (w.rank != 1 || w.shape[0] != x.last_dim()) throw Error("weight", std::string(op) + ": weight must have shape [last dim of x]");
}

// torch's CPU sum over a contiguous fp32 row (ATen SumKernel.cpp: vectorized_inner_sum, row_sum,
// multi_row_sum), vector width 8: see torch_order_sum in kernel_impl.hpp for the prose.
float torch_cpu_sum(const float* v, int64_t n) {
  constexpr int64_t W = 8;
  if (n < W) {  // row_sum over scalars
    float p[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / 4; ++i)
      for (int k = 0; k < 4; ++k) p[k] += v[4 * i + k];
    for (int64_t i = n / 4 * 4; i < n; ++i) p[0] += v[i];
    return ((p[0] + p[1]) + p[2]) + p[3];
  }
  const int64_t vecs = n / W, rows = vecs / 4;
  int64_t power = 0;
  while ((int64_t{1} << power) < rows) ++power;
  power = std::max<int64_t>(4, power / 4);
  const int64_t step = int64_t{1} << power, mask = step - 1;
  float acc[4][4][W] = {};  // [level][vector k of the ILP row][lane]
  auto add_row = [&](int64_t r) {
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < W; ++l) acc[0][k][l] += v[(4 * r + k) * W + l];
  };
  int64_t i = 0;
  while (i + step <= rows) {
    for (int64_t j = 0; j < step; ++j, ++i) add_row(i);
    for (int lev = 1; lev < 4; ++lev) {
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < W; ++l) {
          acc[lev][k][l] += acc[lev - 1][k][l];
          acc[lev - 1][k][l] = 0;
        }
      if ((i & (mask << (lev * power))) != 0) break;
    }
  }
  for (; i < rows; ++i) add_row(i);
  for (int lev = 1; lev < 4; ++lev)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < W; ++l) acc[0][k][l] += acc[lev][k][l];
  for (int64_t u = rows * 4; u < vecs; ++u)
    for (int l = 0; l < W; ++l) acc[0][0][l] += v[u * W + l];
  for (int k = 1; k < 4; ++k)
    for (int l = 0; l < W; ++l) acc[0][0][l] += acc[0][k][l];
  float total = 0;
  for (int64_t t = vecs * W; t < n; ++t) total += v[t];
  for (int l = 0; l < W; ++l) total += acc[0][0][l];
  return total;
}

float lanes64_sum(const float* v, int64_t n) {
  float lanes[kSumLanes] = {};
  for (int64_t i = 0; i < n; ++i) lanes[i % kSumLanes] += v[i];
  for (int half = kSumLanes / 2; half >= 1; half /= 2)
    for (int j = 0; j < half; ++j) lanes[j] += lanes[j + half];
  return lanes[0];
}

}  // namespace

void rms_norm_basic_ops(const TensorView& x, const TensorView& weight, const TensorView& out, const RmsNormOptions& opt) {
  check(x, weight, "rms_norm_basic_ops");
  // out too: the golden writes it (an unsupported dtype was once written as fp32 past a smaller
  // buffer: found by the fuzz target, which sizes its golden output by out's dtype).
  detail::check_view(out, "out", "rms_norm_basic_ops");
  if (out.rank != x.rank || !std::equal(x.shape.begin(), x.shape.begin() + x.rank, out.shape.begin()))
    throw Error("out", "rms_norm_basic_ops: out must have the shape of x " + x.shape_str() + ", got " + out.shape_str());
  const int64_t rows = x.rows(), dim = x.last_dim(), n = rows * dim;
  if (n == 0) return;
  // cast: x32 = x.to(float32)
  std::vector<float> x32(n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) x32[r * dim + i] = load(x, row_offset(x, r) + i);
  // pow: sq = x32 ** 2
  std::vector<float> sq(n);
  for (int64_t k = 0; k < n; ++k) sq[k] = x32[k] * x32[k];
  // mean: sum over the last dim (in options.sum_order), then divide by the count
  std::vector<float> var(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float sum = opt.sum_order == SumOrder::lanes64 ? lanes64_sum(&sq[r * dim], dim) : torch_cpu_sum(&sq[r * dim], dim);
    var[r] = sum / static_cast<float>(dim);
  }
  // add: var + eps (eps rounded to fp32, as torch adds a Python float to an fp32 tensor)
  std::vector<float> var_eps(rows);
  for (int64_t r = 0; r < rows; ++r) var_eps[r] = var[r] + static_cast<float>(opt.eps);
  // rsqrt: 1 / sqrt
  std::vector<float> rinv(rows);
  for (int64_t r = 0; r < rows; ++r) rinv[r] = 1.0f / std::sqrt(var_eps[r]);
  // mul: h32 = x32 * rinv
  std::vector<float> h(n);
  for (int64_t k = 0; k < n; ++k) h[k] = x32[k] * rinv[k / dim];
  // cast: h.to(input_dtype) (hf mode only; fp32 mode keeps fp32)
  if (opt.mode == NormMode::hf)
    for (int64_t k = 0; k < n; ++k) h[k] = round_to(x.dtype, h[k]);
  // mul: weight * h, computed in fp32 and rounded once to the promoted dtype
  std::vector<float> w32(dim);
  for (int64_t i = 0; i < dim; ++i) w32[i] = opt.weight_offset ? load(weight, i) + 1.0f : load(weight, i);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = row_offset(out, r);
    for (int64_t i = 0; i < dim; ++i) store(out, o + i, w32[i] * h[r * dim + i]);
  }
}

void rms_norm_f64(const TensorView& x, const TensorView& weight, double* out64, const RmsNormOptions& opt) {
  check(x, weight, "rms_norm_f64");
  const int64_t rows = x.rows(), dim = x.last_dim();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = row_offset(x, r);
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) {
      const double v = load(x, o + i);
      ss += v * v;
    }
    const double rinv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + opt.eps);
    for (int64_t i = 0; i < dim; ++i) {
      const double w = static_cast<double>(load(weight, i)) + (opt.weight_offset ? 1.0 : 0.0);
      out64[r * dim + i] = static_cast<double>(load(x, o + i)) * rinv * w;
    }
  }
}

}  // namespace opgym::reference
