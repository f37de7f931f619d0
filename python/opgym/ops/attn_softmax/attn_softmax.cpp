// opgym::attn_softmax's torch operators (src/ops/attn_softmax): schemas, CPU, Meta and Autograd kernels.
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
// (at::get_cpu_capability(): AVX512, AVX2 or DEFAULT; include/opgym/attn_softmax.hpp), whatever OPGYM_CPU_ISA
// says: the lane order of the sum is torch's build's, not a choice.
#include <ATen/ATen.h>
#include <ATen/Version.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "opgym/opgym.hpp"
#include "csrc/output_cache.hpp"
#include "csrc/torch_common.hpp"
#include "ops/attn_softmax/attn_softmax.hpp"

namespace opgym_torch {

void run_attn_softmax(const at::Tensor& scores, const at::Tensor& out, double scale,
                      const c10::optional<at::Tensor>& mask, const char* op) {
  opgym::AttnSoftmaxOptions o = attn_softmax_options(scale);
  at::Tensor m;
  opgym::TensorView mv;
  if (mask.has_value()) {
    m = attn_softmax_core_mask(scores, *mask);
    mv = view_of(m);
    o.mask = &mv;
  }
  translate_errors(op, [&] { opgym::attn_softmax(view_of(scores), view_of(out), o, &aten_executor()); });
}

void run_segments(const at::Tensor& scores, const at::Tensor& out, double scale, const at::Tensor& cu,
                  bool block_diagonal, const char* op) {
  TORCH_CHECK_VALUE(cu.device().is_cpu(), "opgym::", op, ": cu_seqlens must be on the CPU (its values are read), got ",
                    cu.device());
  const at::Tensor c = cu.to(at::kLong).contiguous();
  const int64_t n = c.numel();
  TORCH_CHECK_VALUE(n >= 2, "opgym::", op, ": cu_seqlens must hold at least 2 entries (one segment), got ", n);
  translate_errors(op, [&] {
    opgym::attn_softmax_segments(view_of(scores), view_of(out), c.data_ptr<int64_t>(), n - 1, block_diagonal,
                                 attn_softmax_options(scale), &aten_executor());
  });
}

}  // namespace opgym_torch

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers


void check_attn_windows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu) {
  const char* op = "attn_windows";
  check_tensor_arg(q, "query", op);
  check_tensor_arg(k, "key", op);
  check_tensor_arg(v, "value", op);
  check_device(k, "key", q, "query", op);
  check_device(v, "value", q, "query", op);
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "opgym::attn_windows: query, key and value must be "
                    "[1, H, P, D], got ", q.sym_sizes(), ", ", k.sym_sizes(), ", ", v.sym_sizes());
  TORCH_CHECK_VALUE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                    "opgym::attn_windows: query, key and value must have one dtype");
  OPGYM_SYM_CHECK_VALUE(q.sym_size(0).sym_eq(1).sym_and(k.sym_size(0).sym_eq(1)).sym_and(v.sym_size(0).sym_eq(1))
                            .sym_and(k.sym_size(1).sym_eq(q.sym_size(1))).sym_and(k.sym_size(2).sym_eq(q.sym_size(2)))
                            .sym_and(k.sym_size(3).sym_eq(q.sym_size(3))).sym_and(v.sym_size(1).sym_eq(q.sym_size(1)))
                            .sym_and(v.sym_size(2).sym_eq(q.sym_size(2))),
                        "opgym::attn_windows: query, key and value must be [1, H, P, D] alike, got ", q.sym_sizes(), ", ",
                        k.sym_sizes(), ", ", v.sym_sizes());
  TORCH_CHECK_VALUE(cu.defined() && cu.dim() == 1 && (cu.scalar_type() == at::kInt || cu.scalar_type() == at::kLong),
                    "opgym::attn_windows: cu_seqlens must be a 1-D int32 or int64 tensor");
}

at::Tensor attn_windows_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            const at::Tensor& cu) {
  const char* op = "attn_windows";
  check_attn_windows(q, k, v, cu);
  TORCH_CHECK_VALUE(cu.device().is_cpu(), "opgym::attn_windows: cu_seqlens must be on the CPU (its values are read)");
  const int64_t H = q.size(1), P = q.size(2), D = q.size(3), Dv = v.size(3);
  const at::Tensor c = cu.to(at::kLong).contiguous();
  const int64_t* b = c.data_ptr<int64_t>();
  const int64_t n = c.numel() - 1;
  TORCH_CHECK_VALUE(n >= 1 && b[0] == 0 && b[n] == P, "opgym::", op, ": cu_seqlens must run from 0 to the ", P,
                    " patches");
  // runs of consecutive equal-length windows: (first row, windows, length)
  std::vector<std::array<int64_t, 3>> runs;
  int64_t lmax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = b[i + 1] - b[i];
    TORCH_CHECK_VALUE(len > 0, "opgym::", op, ": cu_seqlens must be increasing");
    lmax = std::max(lmax, len);
    if (!runs.empty() && runs.back()[2] == len) {
      ++runs.back()[1];
    } else {
      runs.push_back({b[i], 1, len});
    }
  }
  const at::Tensor q3 = q.select(0, 0), k3 = k.select(0, 0), v3 = v.select(0, 0);
  at::Tensor o;
  if (runs.size() == 1) {
    const int64_t w = runs[0][1], L = runs[0][2];
    const at::Tensor s = at::matmul(q3.view({H, w, L, D}), k3.view({H, w, L, D}).transpose(-1, -2));
    run_attn_softmax(s, s, scale, c10::nullopt, op);
    o = at::matmul(s, v3.view({H, w, L, Dv})).view({H, P, Dv});
  } else {
    const at::Tensor s = at::empty({H, P, lmax}, q.options());
    for (const auto& r : runs) {
      const int64_t r0 = r[0], w = r[1], L = r[2], r1 = r0 + w * L;
      at::Tensor dst = s.slice(1, r0, r1).slice(2, 0, L).view({H, w, L, L});
      at::matmul_out(dst, q3.slice(1, r0, r1).view({H, w, L, D}), k3.slice(1, r0, r1).view({H, w, L, D}).transpose(-1, -2));
    }
    run_segments(s, s, scale, c, false, op);
    o = at::empty({H, P, Dv}, q.options());
    for (const auto& r : runs) {
      const int64_t r0 = r[0], w = r[1], L = r[2], r1 = r0 + w * L;
      at::Tensor dst = o.slice(1, r0, r1).view({H, w, L, Dv});
      at::matmul_out(dst, s.slice(1, r0, r1).slice(2, 0, L).view({H, w, L, L}), v3.slice(1, r0, r1).view({H, w, L, Dv}));
    }
  }
  return o.transpose(0, 1).contiguous().unsqueeze(0);  // HF's torch.cat of the windows' [1, L, H, Dv]
}

at::Tensor attn_windows_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double,
                             const at::Tensor& cu) {
  check_attn_windows(q, k, v, cu);
  return at::empty_symint({q.sym_size(0), q.sym_size(2), q.sym_size(1), v.sym_size(3)}, q.options());
}

void check_attn_eager(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t groups) {
  const char* op = "attn_eager";
  check_tensor_arg(q, "query", op);
  check_tensor_arg(k, "key", op);
  check_tensor_arg(v, "value", op);
  check_device(k, "key", q, "query", op);
  check_device(v, "value", q, "query", op);
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "opgym::attn_eager: query, key and value must be "
                    "4-D [B, heads, len, head_dim], got ", q.sym_sizes(), ", ", k.sym_sizes(), ", ", v.sym_sizes());
  TORCH_CHECK_VALUE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                    "opgym::attn_eager: query, key and value must have one dtype");
  TORCH_CHECK_VALUE(groups >= 1, "opgym::attn_eager: groups must be >= 1, got ", groups);
  OPGYM_SYM_CHECK_VALUE(q.sym_size(1).sym_eq(k.sym_size(1) * groups).sym_and(v.sym_size(1).sym_eq(k.sym_size(1))),
                        "opgym::attn_eager: query heads must be key heads x groups (and value heads key heads), got ",
                        q.sym_sizes(), ", ", k.sym_sizes(), ", ", v.sym_sizes(), ", groups ", groups);
}

// HF's repeat_kv: hidden[:, :, None].expand(B, KV, n_rep, T, D).reshape(B, KV * n_rep, T, D) (itself when n_rep is 1).
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t B = x.size(0), KV = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, KV, n_rep, T, D}).reshape({B, KV * n_rep, T, D});
}

std::tuple<at::Tensor, at::Tensor> attn_eager_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  double scale, const c10::optional<at::Tensor>& mask, int64_t groups,
                                                  bool grouped) {
  check_attn_eager(q, k, v, groups);
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), D = q.size(3);
  const int64_t KV = k.size(1), T = k.size(2), Dv = v.size(3);
  at::Tensor weights, out;
  if (grouped && groups > 1) {
    const at::Tensor w = at::matmul(q.reshape({B, KV, groups * S, D}), k.transpose(2, 3));
    weights = w.view({B, H, S, T});
    check_attn_softmax(weights, mask, "attn_eager");
    run_attn_softmax(weights, weights, scale, mask, "attn_eager");
    out = at::matmul(w, v).view({B, H, S, Dv});
  } else {
    weights = at::matmul(q, repeat_kv(k, groups).transpose(2, 3));
    check_attn_softmax(weights, mask, "attn_eager");
    run_attn_softmax(weights, weights, scale, mask, "attn_eager");
    out = at::matmul(weights, repeat_kv(v, groups));
  }
  return {out.transpose(1, 2).contiguous(), weights};
}

std::tuple<at::Tensor, at::Tensor> attn_eager_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   double, const c10::optional<at::Tensor>& mask, int64_t groups,
                                                   bool) {
  check_attn_eager(q, k, v, groups);
  at::Tensor weights = at::empty_symint({q.sym_size(0), q.sym_size(1), q.sym_size(2), k.sym_size(2)}, q.options());
  check_attn_softmax(weights, mask, "attn_eager");
  at::Tensor out = at::empty_symint({q.sym_size(0), q.sym_size(2), q.sym_size(1), v.sym_size(3)}, q.options());
  return {out, weights};
}

// A functional call reads any strided scores (a last dim that is not contiguous is copied first).
at::Tensor readable(const at::Tensor& scores) {
  return scores.dim() == 0 || scores.size(-1) <= 1 || scores.stride(-1) == 1 ? scores : scores.contiguous();
}

at::Tensor attn_softmax_cpu(const at::Tensor& scores, double scale, const c10::optional<at::Tensor>& mask) {
  check_attn_softmax(scores, mask, "attn_softmax");
  at::Tensor out = empty_output(scores.sizes(), scores.scalar_type());  // contiguous, as HF's .to() gives it
  run_attn_softmax(readable(scores), out, scale, mask, "attn_softmax");
  return out;
}

void attn_softmax__cpu(const at::Tensor& scores, double scale, const c10::optional<at::Tensor>& mask) {
  check_attn_softmax(scores, mask, "attn_softmax_");
  run_attn_softmax(scores, scores, scale, mask, "attn_softmax_");
}

at::Tensor attn_softmax_meta(const at::Tensor& scores, double, const c10::optional<at::Tensor>& mask) {
  check_attn_softmax(scores, mask, "attn_softmax");
  return at::empty_symint(scores.sym_sizes(), scores.options());
}

void attn_softmax__meta(const at::Tensor& scores, double, const c10::optional<at::Tensor>& mask) {
  check_attn_softmax(scores, mask, "attn_softmax_");
}

at::Tensor attn_softmax_segments_cpu(const at::Tensor& scores, double scale, const at::Tensor& cu, bool block_diagonal) {
  check_attn_softmax_segments(scores, cu, "attn_softmax_segments");
  at::Tensor out = empty_output(scores.sizes(), scores.scalar_type());
  run_segments(readable(scores), out, scale, cu, block_diagonal, "attn_softmax_segments");
  return out;
}

void attn_softmax_segments__cpu(const at::Tensor& scores, double scale, const at::Tensor& cu, bool block_diagonal) {
  check_attn_softmax_segments(scores, cu, "attn_softmax_segments_");
  run_segments(scores, scores, scale, cu, block_diagonal, "attn_softmax_segments_");
}

at::Tensor attn_softmax_segments_meta(const at::Tensor& scores, double, const at::Tensor& cu, bool) {
  check_attn_softmax_segments(scores, cu, "attn_softmax_segments");
  return at::empty_symint(scores.sym_sizes(), scores.options());
}

void attn_softmax_segments__meta(const at::Tensor& scores, double, const at::Tensor& cu, bool) {
  check_attn_softmax_segments(scores, cu, "attn_softmax_segments_");
}

constexpr const char* kNoGrad =
    " has no backward (an inference kernel); call it under torch.no_grad(), or use HF's own attention where "
    "gradients are needed";

at::Tensor attn_softmax_autograd(c10::DispatchKeySet ks, const at::Tensor& scores, double scale,
                                 const c10::optional<at::Tensor>& mask) {
  TORCH_CHECK(!grad_needed({&scores}) && !(mask.has_value() && grad_needed({&*mask})), "opgym::attn_softmax", kNoGrad);
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::attn_softmax", "")
                             .typed<at::Tensor(const at::Tensor&, double, const c10::optional<at::Tensor>&)>();
  return op.redispatch(ks & c10::after_autograd_keyset, scores, scale, mask);
}

at::Tensor attn_softmax_segments_autograd(c10::DispatchKeySet ks, const at::Tensor& scores, double scale,
                                          const at::Tensor& cu, bool block_diagonal) {
  TORCH_CHECK(!grad_needed({&scores}), "opgym::attn_softmax_segments", kNoGrad);
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::attn_softmax_segments", "")
                             .typed<at::Tensor(const at::Tensor&, double, const at::Tensor&, bool)>();
  return op.redispatch(ks & c10::after_autograd_keyset, scores, scale, cu, block_diagonal);
}

void attn_softmax__autograd(c10::DispatchKeySet ks, const at::Tensor& scores, double scale,
                            const c10::optional<at::Tensor>& mask) {
  TORCH_CHECK(!grad_needed({&scores}) && !(mask.has_value() && grad_needed({&*mask})), "opgym::attn_softmax_", kNoGrad);
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::attn_softmax_", "")
                             .typed<void(const at::Tensor&, double, const c10::optional<at::Tensor>&)>();
  op.redispatch(ks & c10::after_autograd_keyset, scores, scale, mask);
}

void attn_softmax_segments__autograd(c10::DispatchKeySet ks, const at::Tensor& scores, double scale,
                                     const at::Tensor& cu, bool block_diagonal) {
  TORCH_CHECK(!grad_needed({&scores}), "opgym::attn_softmax_segments_", kNoGrad);
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::attn_softmax_segments_", "")
                             .typed<void(const at::Tensor&, double, const at::Tensor&, bool)>();
  op.redispatch(ks & c10::after_autograd_keyset, scores, scale, cu, block_diagonal);
}

std::tuple<at::Tensor, at::Tensor> attn_eager_autograd(c10::DispatchKeySet ks, const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v, double scale,
                                                       const c10::optional<at::Tensor>& mask, int64_t groups,
                                                       bool grouped) {
  TORCH_CHECK(!grad_needed({&q, &k, &v}) && !(mask.has_value() && grad_needed({&*mask})), "opgym::attn_eager", kNoGrad);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("opgym::attn_eager", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                                    const c10::optional<at::Tensor>&, int64_t, bool)>();
  return op.redispatch(ks & c10::after_autograd_keyset, q, k, v, scale, mask, groups, grouped);
}

at::Tensor attn_windows_autograd(c10::DispatchKeySet ks, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale, const at::Tensor& cu) {
  TORCH_CHECK(!grad_needed({&q, &k, &v}), "opgym::attn_windows", kNoGrad);
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::attn_windows", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                               const at::Tensor&)>();
  return op.redispatch(ks & c10::after_autograd_keyset, q, k, v, scale, cu);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opgym, m) {
  m.def("attn_windows(Tensor query, Tensor key, Tensor value, float scale, Tensor cu_seqlens) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  m.def("attn_eager(Tensor query, Tensor key, Tensor value, float scale, Tensor? mask=None, int groups=1, "
        "bool grouped=False) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
  m.def("attn_softmax(Tensor scores, float scale, Tensor? mask=None) -> Tensor", {at::Tag::pt2_compliant_tag});
  // The in-place forms return nothing: torch.compile functionalizes a custom op's mutation only then.
  m.def("attn_softmax_(Tensor(a!) scores, float scale, Tensor? mask=None) -> ()", {at::Tag::pt2_compliant_tag});
  m.def("attn_softmax_segments(Tensor scores, float scale, Tensor cu_seqlens, bool block_diagonal=False) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  m.def("attn_softmax_segments_(Tensor(a!) scores, float scale, Tensor cu_seqlens, bool block_diagonal=False) -> ()",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("attn_softmax", &attn_softmax_cpu);
  m.impl("attn_softmax_", &attn_softmax__cpu);
  m.impl("attn_softmax_segments", &attn_softmax_segments_cpu);
  m.impl("attn_softmax_segments_", &attn_softmax_segments__cpu);
  m.impl("attn_eager", &attn_eager_cpu);
  m.impl("attn_windows", &attn_windows_cpu);
}
TORCH_LIBRARY_IMPL(opgym, Meta, m) {
  m.impl("attn_softmax", &attn_softmax_meta);
  m.impl("attn_softmax_", &attn_softmax__meta);
  m.impl("attn_softmax_segments", &attn_softmax_segments_meta);
  m.impl("attn_softmax_segments_", &attn_softmax_segments__meta);
  m.impl("attn_eager", &attn_eager_meta);
  m.impl("attn_windows", &attn_windows_meta);
}
TORCH_LIBRARY_IMPL(opgym, Autograd, m) {
  m.impl("attn_softmax", &attn_softmax_autograd);
  m.impl("attn_softmax_", &attn_softmax__autograd);
  m.impl("attn_softmax_segments", &attn_softmax_segments_autograd);
  m.impl("attn_softmax_segments_", &attn_softmax_segments__autograd);
  m.impl("attn_eager", &attn_eager_autograd);
  m.impl("attn_windows", &attn_windows_autograd);
}
