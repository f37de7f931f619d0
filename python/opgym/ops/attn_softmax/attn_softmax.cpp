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
//
// On the CPU the result is torch's own softmax bit for bit for the build torch runs here
// (at::get_cpu_capability(): AVX512, AVX2 or DEFAULT; include/opgym/attn_softmax.hpp), whatever OPGYM_CPU_ISA
// says: the lane order of the sum is torch's build's, not a choice.
#include <ATen/ATen.h>
#include <ATen/Version.h>
#include <torch/library.h>

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(opgym, m) {
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
}
TORCH_LIBRARY_IMPL(opgym, Meta, m) {
  m.impl("attn_softmax", &attn_softmax_meta);
  m.impl("attn_softmax_", &attn_softmax__meta);
  m.impl("attn_softmax_segments", &attn_softmax_segments_meta);
  m.impl("attn_softmax_segments_", &attn_softmax_segments__meta);
  m.impl("attn_eager", &attn_eager_meta);
}
TORCH_LIBRARY_IMPL(opgym, Autograd, m) {
  m.impl("attn_softmax", &attn_softmax_autograd);
  m.impl("attn_softmax_", &attn_softmax__autograd);
  m.impl("attn_softmax_segments", &attn_softmax_segments_autograd);
  m.impl("attn_softmax_segments_", &attn_softmax_segments__autograd);
  m.impl("attn_eager", &attn_eager_autograd);
}
