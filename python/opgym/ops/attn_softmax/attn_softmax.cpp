// opgym::attn_softmax's CPU kernels on torch's stable ABI (built into opgym/_stable.so; src/ops/attn_softmax is
// the core). Schemas, fake kernels and autograd rules: meta.py beside this file. CUDA kernels: attn_softmax_cuda.cpp
// (opgym/_stable_cuda.so); both run the checks of attn_softmax_stable.hpp. torch's own matmuls are called through the dispatcher.
//
//   opgym::attn_softmax(Tensor scores, float scale, Tensor? mask=None) -> Tensor
//   opgym::attn_softmax_(Tensor(a!) scores, float scale, Tensor? mask=None) -> ()              in place
//       softmax(scores * scale + mask, -1, dtype=float32).to(scores.dtype): HF eager attention's statements
//       between its two matmuls, with their bits. mask: scores' dtype, broadcastable to scores (HF's
//       [B, 1, Sq, Sk] over the heads).
//   opgym::attn_softmax_segments(Tensor scores, float scale, Tensor cu_seqlens, bool block_diagonal=False) -> Tensor
//   opgym::attn_softmax_segments_(Tensor(a!) scores, ...) -> ()                                in place
//       scores [..., P, W]: the softmax of each segment's rows over its own columns (vision windows in one
//       buffer), zeros elsewhere; cu_seqlens: int32 or int64, [segments + 1] from 0 to P (read on the CPU).
//
//   opgym::attn_eager(Tensor query, Tensor key, Tensor value, float scale, Tensor? mask=None, int groups=1,
//                     bool grouped=False) -> (Tensor, Tensor)
//       HF eager_attention_forward's statements in one operator (transformers 5.23, dropout a no-op): torch's own
//       matmuls (at::matmul, the calls HF makes) around attn_softmax_ in place on the scores; returns HF's
//       (attn_output.transpose(1, 2).contiguous(), attn_weights). query [B, H, S, D], key [B, KV, T, D], value
//       [B, KV, T, Dv], H = KV * groups. grouped=False: repeat_kv's copies of K and V (HF's expand + reshape) when
//       groups > 1; grouped=True: q seen as [B, KV, groups * S, D] against the shared K/V (no copies) - the caller
//       decides, by a probe of the GEMM's bits (python/opgym/ops/attn_softmax/text.py). One top-level op where
//       HF runs fifteen.
//   opgym::attn_windows(Tensor query, Tensor key, Tensor value, float scale, Tensor cu_seqlens) -> Tensor
//       A vision block's attention within windows, all windows in one pass (Qwen2.5-VL's loop of per-window
//       eager_attention_forward calls, unmasked, no GQA): query/key [1, H, P, D], value [1, H, P, Dv] (HF's views),
//       windows [cu_seqlens[i], cu_seqlens[i + 1]) covering the P patches; returns HF's concatenated [1, P, H, Dv].
//       Equal windows: one batched at::matmul per product over [H, windows, L, *] views, the core in place on the
//       [H, windows, L, L] scores; uneven: each run of equal windows one at::matmul_out into its rows of a packed
//       [H, P, Lmax] buffer, the segmented core, the same for the output. Whether that gives each window HF's bits
//       is torch's GEMM's property: python/opgym/ops/attn_softmax/vision.py probes it before calling this.
//
// On the CPU the result is torch's own softmax bit for bit for the build torch runs here
// (torch.backends.cpu.get_cpu_capability(), handed over by meta.py at load: AVX512, AVX2 or DEFAULT;
// include/opgym/attn_softmax.hpp), whatever OPGYM_CPU_ISA
// says: the lane order of the sum is torch's build's, not a choice.
#include <algorithm>
#include <array>
#include <atomic>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"
#include "ops/attn_softmax/attn_softmax_stable.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers
using OptTensor = std::optional<Tensor>;
using Shape = std::vector<int64_t>;

void matmul_out(Tensor out, Tensor a, Tensor b) { call_op("aten::matmul", "out", a, b, out); }  // torch's matmul into out
Tensor vw(const Tensor& t, const Shape& s) { return torch::stable::view(t, s); }  // a view of t shaped s
Tensor slice(Tensor t, int64_t dim, int64_t start, int64_t end) {
  return torch::stable::narrow(t, dim, start, end - start);
}

// The torch build's CPU capability (its softmax's lane order and exp), set once at load by meta.py.
std::atomic<int> g_torch_isa{static_cast<int>(opgym::CpuIsa::scalar)};
void set_torch_cpu_capability(std::string c) {
  const opgym::CpuIsa isa = c == "AVX512" ? opgym::CpuIsa::avx512 : c == "AVX2" ? opgym::CpuIsa::avx2
                                                                                  : opgym::CpuIsa::scalar;
  g_torch_isa.store(static_cast<int>(isa));
}

opgym::AttnSoftmaxOptions options(double scale) {
  opgym::AttnSoftmaxOptions o;
  o.scale = static_cast<float>(scale);  // what torch's mul does with a Python float
  o.torch_isa = static_cast<opgym::CpuIsa>(g_torch_isa.load());
  return o;
}

void check_segments(const Tensor& scores, const Tensor& cu, const char* op) {
  check_tensor_arg(scores, "scores", op);
  OPGYM_CHECK_VALUE(scores.dim() >= 2 && scores.dim() <= opgym::kMaxRank, "opgym::", op,
                    ": scores must be [..., P, W] (rank 2 to ", opgym::kMaxRank, "), got ", sizes_of(scores));
  OPGYM_CHECK_VALUE(cu.defined() && cu.dim() == 1 &&
                        (cu.scalar_type() == ScalarType::Int || cu.scalar_type() == ScalarType::Long),
                    "opgym::", op, ": cu_seqlens must be a 1-D int32 or int64 tensor");
}

void run_attn_softmax(const Tensor& scores, const Tensor& out, double scale, const OptTensor& mask, const char* op) {
  opgym::AttnSoftmaxOptions o = options(scale);
  Tensor m;
  opgym::TensorView mv;
  if (mask.has_value()) {
    m = attn_softmax_core_mask(scores, *mask);
    mv = view_of(m);
    o.mask = &mv;
  }
  translate_errors(op, [&] { opgym::attn_softmax(view_of(scores), view_of(out), o, &executor()); });
}

// cu_seqlens as int64 on the CPU, its values read.
Tensor cu_long(const Tensor& cu, const char* op) {
  OPGYM_CHECK_VALUE(cu.is_cpu(), "opgym::", op, ": cu_seqlens must be on the CPU (its values are read), got ",
                    device_name(cu));
  return torch::stable::contiguous(torch::stable::to(cu, ScalarType::Long));
}

void run_segments(const Tensor& scores, const Tensor& out, double scale, const Tensor& cu, bool block_diagonal,
                  const char* op) {
  const Tensor c = cu_long(cu, op);
  const int64_t n = c.numel();
  OPGYM_CHECK_VALUE(n >= 2, "opgym::", op, ": cu_seqlens must hold at least 2 entries (one segment), got ", n);
  translate_errors(op, [&] {
    opgym::attn_softmax_segments(view_of(scores), view_of(out), static_cast<const int64_t*>(c.data_ptr()), n - 1,
                                 block_diagonal, options(scale), &executor());
  });
}

Tensor attn_softmax_cpu(Tensor scores, double scale, OptTensor mask) {
  check_attn_softmax(scores, mask, "attn_softmax");
  Tensor out = empty_output(scores.sizes(), scores.scalar_type());  // contiguous, as HF's .to() gives it
  run_attn_softmax(attn_softmax_readable(scores), out, scale, mask, "attn_softmax");
  return out;
}

void attn_softmax__cpu(Tensor scores, double scale, OptTensor mask) {
  check_attn_softmax(scores, mask, "attn_softmax_");
  run_attn_softmax(scores, scores, scale, mask, "attn_softmax_");
}

Tensor attn_softmax_segments_cpu(Tensor scores, double scale, Tensor cu, bool block_diagonal) {
  check_segments(scores, cu, "attn_softmax_segments");
  Tensor out = empty_output(scores.sizes(), scores.scalar_type());
  run_segments(attn_softmax_readable(scores), out, scale, cu, block_diagonal, "attn_softmax_segments");
  return out;
}

void attn_softmax_segments__cpu(Tensor scores, double scale, Tensor cu, bool block_diagonal) {
  check_segments(scores, cu, "attn_softmax_segments_");
  run_segments(scores, scores, scale, cu, block_diagonal, "attn_softmax_segments_");
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  check_tensor_arg(q, "query", op);
  check_tensor_arg(k, "key", op);
  check_tensor_arg(v, "value", op);
  check_device(k, "key", q, "query", op);
  check_device(v, "value", q, "query", op);
}

void check_attn_windows(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu) {
  check_qkv(q, k, v, "attn_windows");
  OPGYM_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "opgym::attn_windows: query, key and value must be "
                    "[1, H, P, D], got ", sizes_of(q), ", ", sizes_of(k), ", ", sizes_of(v));
  OPGYM_CHECK_VALUE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                    "opgym::attn_windows: query, key and value must have one dtype");
  const bool alike = q.size(0) == 1 && k.size(0) == 1 && v.size(0) == 1 && k.size(1) == q.size(1) &&
                     k.size(2) == q.size(2) && k.size(3) == q.size(3) && v.size(1) == q.size(1) &&
                     v.size(2) == q.size(2);
  OPGYM_CHECK_VALUE(alike, "opgym::attn_windows: query, key and value must be [1, H, P, D] alike, got ", sizes_of(q),
                    ", ", sizes_of(k), ", ", sizes_of(v));
  OPGYM_CHECK_VALUE(cu.defined() && cu.dim() == 1 &&
                        (cu.scalar_type() == ScalarType::Int || cu.scalar_type() == ScalarType::Long),
                    "opgym::attn_windows: cu_seqlens must be a 1-D int32 or int64 tensor");
}

Tensor attn_windows_cpu(Tensor q, Tensor k, Tensor v, double scale, Tensor cu) {
  const char* op = "attn_windows";
  check_attn_windows(q, k, v, cu);
  OPGYM_CHECK_VALUE(cu.is_cpu(), "opgym::attn_windows: cu_seqlens must be on the CPU (its values are read)");
  const int64_t H = q.size(1), P = q.size(2), D = q.size(3), Dv = v.size(3);
  const Tensor c = cu_long(cu, op);
  const int64_t* b = static_cast<const int64_t*>(c.data_ptr());
  const int64_t n = c.numel() - 1;
  OPGYM_CHECK_VALUE(n >= 1 && b[0] == 0 && b[n] == P, "opgym::", op, ": cu_seqlens must run from 0 to the ", P,
                    " patches");
  // runs of consecutive equal-length windows: (first row, windows, length)
  std::vector<std::array<int64_t, 3>> runs;
  int64_t lmax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = b[i + 1] - b[i];
    OPGYM_CHECK_VALUE(len > 0, "opgym::", op, ": cu_seqlens must be increasing");
    lmax = std::max(lmax, len);
    if (!runs.empty() && runs.back()[2] == len) {
      ++runs.back()[1];
    } else {
      runs.push_back({b[i], 1, len});
    }
  }
  const Tensor q3 = torch::stable::select(q, 0, 0), k3 = torch::stable::select(k, 0, 0),
               v3 = torch::stable::select(v, 0, 0);
  Tensor o;
  if (runs.size() == 1) {
    const int64_t w = runs[0][1], L = runs[0][2];
    const Tensor s = torch::stable::matmul(vw(q3, {H, w, L, D}), torch::stable::transpose(vw(k3, {H, w, L, D}), -1, -2));
    run_attn_softmax(s, s, scale, std::nullopt, op);
    o = vw(torch::stable::matmul(s, vw(v3, {H, w, L, Dv})), {H, P, Dv});
  } else {
    const Tensor s = torch::stable::empty({H, P, lmax}, q.scalar_type(), std::nullopt, q.device());
    for (const auto& r : runs) {
      const int64_t r0 = r[0], w = r[1], L = r[2], r1 = r0 + w * L;
      const Tensor dst = vw(slice(slice(s, 1, r0, r1), 2, 0, L), {H, w, L, L});
      matmul_out(dst, vw(slice(q3, 1, r0, r1), {H, w, L, D}),
                 torch::stable::transpose(vw(slice(k3, 1, r0, r1), {H, w, L, D}), -1, -2));
    }
    run_segments(s, s, scale, c, false, op);
    o = torch::stable::empty({H, P, Dv}, q.scalar_type(), std::nullopt, q.device());
    for (const auto& r : runs) {
      const int64_t r0 = r[0], w = r[1], L = r[2], r1 = r0 + w * L;
      const Tensor dst = vw(slice(o, 1, r0, r1), {H, w, L, Dv});
      matmul_out(dst, vw(slice(slice(s, 1, r0, r1), 2, 0, L), {H, w, L, L}), vw(slice(v3, 1, r0, r1), {H, w, L, Dv}));
    }
  }
  // HF's torch.cat of the windows' [1, L, H, Dv]
  return torch::stable::unsqueeze(torch::stable::contiguous(torch::stable::transpose(o, 0, 1)), 0);
}

void check_attn_eager(const Tensor& q, const Tensor& k, const Tensor& v, int64_t groups) {
  check_qkv(q, k, v, "attn_eager");
  OPGYM_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "opgym::attn_eager: query, key and value must be "
                    "4-D [B, heads, len, head_dim], got ", sizes_of(q), ", ", sizes_of(k), ", ", sizes_of(v));
  OPGYM_CHECK_VALUE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                    "opgym::attn_eager: query, key and value must have one dtype");
  OPGYM_CHECK_VALUE(groups >= 1, "opgym::attn_eager: groups must be >= 1, got ", groups);
  OPGYM_CHECK_VALUE(q.size(1) == k.size(1) * groups && v.size(1) == k.size(1),
                    "opgym::attn_eager: query heads must be key heads x groups (and value heads key heads), got ",
                    sizes_of(q), ", ", sizes_of(k), ", ", sizes_of(v), ", groups ", groups);
}

// HF's repeat_kv: hidden[:, :, None].expand(B, KV, n_rep, T, D).reshape(B, KV * n_rep, T, D) (itself when n_rep is 1).
Tensor repeat_kv(const Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t B = x.size(0), KV = x.size(1), T = x.size(2), D = x.size(3);
  const Tensor e = call_op("aten::expand", "", torch::stable::unsqueeze(x, 2), Shape{B, KV, n_rep, T, D}, false);
  return torch::stable::reshape(e, {B, KV * n_rep, T, D});
}

std::tuple<Tensor, Tensor> attn_eager_cpu(Tensor q, Tensor k, Tensor v, double scale, OptTensor mask, int64_t groups,
                                          bool grouped) {
  check_attn_eager(q, k, v, groups);
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3);
  const int64_t KV = k.size(1), T = k.size(2), Dv = v.size(3);
  Tensor weights, out;
  if (grouped && groups > 1) {
    const Tensor w = torch::stable::matmul(torch::stable::reshape(q, {B, KV, groups * S, D}), torch::stable::transpose(k, 2, 3));
    weights = vw(w, {B, H, S, T});
    check_attn_softmax(weights, mask, "attn_eager");
    run_attn_softmax(weights, weights, scale, mask, "attn_eager");
    out = vw(torch::stable::matmul(w, v), {B, H, S, Dv});
  } else {
    weights = torch::stable::matmul(q, torch::stable::transpose(repeat_kv(k, groups), 2, 3));
    check_attn_softmax(weights, mask, "attn_eager");
    run_attn_softmax(weights, weights, scale, mask, "attn_eager");
    out = torch::stable::matmul(weights, repeat_kv(v, groups));
  }
  return {torch::stable::contiguous(torch::stable::transpose(out, 1, 2)), weights};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("attn_softmax", TORCH_BOX(&attn_softmax_cpu));
  m.impl("attn_softmax_", TORCH_BOX(&attn_softmax__cpu));
  m.impl("attn_softmax_segments", TORCH_BOX(&attn_softmax_segments_cpu));
  m.impl("attn_softmax_segments_", TORCH_BOX(&attn_softmax_segments__cpu));
  m.impl("attn_eager", TORCH_BOX(&attn_eager_cpu));
  m.impl("attn_windows", TORCH_BOX(&attn_windows_cpu));
}

STABLE_TORCH_LIBRARY_IMPL(opgym_internal, CompositeExplicitAutograd, m) {
  m.impl("set_torch_cpu_capability", TORCH_BOX(&set_torch_cpu_capability));
}
