// opgym::rotary's torch operators (src/ops/rotary): schemas, CPU, Meta, Autograd and ADInplaceOrView
// kernels. CUDA kernels: rotary_cuda.cpp; the checks both share: rotary.hpp.
//
//   opgym::rotary(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1, str mode="hf",
//                 int[]? mrope_section=None, str pairs="half", bool pair_table=False,
//                 bool contiguous=False) -> (Tensor q_embed, Tensor k_embed)
//   opgym::rotary_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, int unsqueeze_dim=1,
//                  str rotary_mode="hf", int[]? mrope_section=None, str pairs="half",
//                  bool pair_table=False) -> ()
//
// cos and sin are HF's tables before its unsqueeze ([B, S, R] for the text path with unsqueeze_dim 1,
// [S, R] for the vision path with -2; [3, ...] with mrope_section; R / 2 wide with pair_table); a
// rotary dim R below q's last dim rotates the first R dims and copies the rest. mode "hf" is
// apply_rotary_pos_emb's bf16/fp16 sequence, "fp32" the upcast of apply_rotary_pos_emb_vision and
// its kin; pairs "half" (rotate_half), "interleaved" (adjacent pairs), "deinterleave" (adjacent pairs
// in, halves out: DeepSeek-V3). The functional outputs have q's and k's layout where torch's
// elementwise ops would keep it (empty_like), or are contiguous with `contiguous` (what HF's
// torch.cat gives), so downstream ops see the strides HF's code gives them.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>

#include "csrc/torch_common.hpp"
#include "opgym/opgym.hpp"
#include "ops/rotary/rotary.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

std::tuple<at::Tensor, at::Tensor> rotary_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                              const at::Tensor& sin, int64_t unsqueeze_dim, c10::string_view mode,
                                              c10::optional<at::IntArrayRef> mrope_section,
                                              c10::string_view pairs, bool pair_table, bool contiguous) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary");
  at::Tensor qo = rotary_output(q, contiguous), ko = rotary_output(k, contiguous);
  translate_errors("rotary", [&] {
    opgym::rotary(view_of(q), view_of(k), view_of(cos), view_of(sin), view_of(qo), view_of(ko),
                  rotary_options(unsqueeze_dim, mode, mrope_section, pairs, pair_table), &aten_executor());
  });
  return {qo, ko};
}

void rotary_inplace_cpu(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                        int64_t unsqueeze_dim, c10::string_view mode, c10::optional<at::IntArrayRef> mrope_section,
                        c10::string_view pairs, bool pair_table) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary_");
  translate_errors("rotary_", [&] {
    opgym::rotary(view_of(q), view_of(k), view_of(cos), view_of(sin), view_of(q), view_of(k),
                  rotary_options(unsqueeze_dim, mode, mrope_section, pairs, pair_table), &aten_executor());
  });
}

std::tuple<at::Tensor, at::Tensor> rotary_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                               const at::Tensor& sin, int64_t /*unsqueeze_dim*/, c10::string_view mode,
                                               c10::optional<at::IntArrayRef> mrope_section, c10::string_view pairs,
                                               bool /*pair_table*/, bool contiguous) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary");
  return {rotary_output(q, contiguous), rotary_output(k, contiguous)};
}

void rotary_inplace_meta(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                         int64_t /*unsqueeze_dim*/, c10::string_view mode, c10::optional<at::IntArrayRef> mrope_section,
                         c10::string_view pairs, bool /*pair_table*/) {
  check_rotary(q, k, cos, sin, mode, mrope_section, pairs, "rotary_");
}

using FunctionalFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                        const at::Tensor&, int64_t, c10::string_view,
                                                        c10::optional<at::IntArrayRef>, c10::string_view, bool, bool);
using InplaceFn = void(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, c10::string_view,
                       c10::optional<at::IntArrayRef>, c10::string_view, bool);

c10::TypedOperatorHandle<FunctionalFn>& functional_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::rotary", "").typed<FunctionalFn>();
  return op;
}
c10::TypedOperatorHandle<InplaceFn>& inplace_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opgym::rotary_", "").typed<InplaceFn>();
  return op;
}

std::tuple<at::Tensor, at::Tensor> rotary_autograd(c10::DispatchKeySet ks, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& cos, const at::Tensor& sin, int64_t unsqueeze_dim,
                                                   c10::string_view mode, c10::optional<at::IntArrayRef> mrope_section,
                                                   c10::string_view pairs, bool pair_table, bool contiguous) {
  TORCH_CHECK(!grad_needed({&q, &k, &cos, &sin}),
              "opgym::rotary has no backward (an inference kernel); call it under torch.no_grad(), or use HF's own "
              "function where gradients are needed (opgym.patch does so by itself)");
  return functional_op().redispatch(ks & c10::after_autograd_keyset, q, k, cos, sin, unsqueeze_dim, mode, mrope_section,
                                    pairs, pair_table, contiguous);
}

void rotary_inplace_autograd(c10::DispatchKeySet ks, at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                             const at::Tensor& sin, int64_t unsqueeze_dim, c10::string_view mode,
                             c10::optional<at::IntArrayRef> mrope_section, c10::string_view pairs, bool pair_table) {
  TORCH_CHECK(!grad_needed({&q, &k, &cos, &sin}),
              "opgym::rotary_ has no autograd (an inference kernel); call it under torch.no_grad()");
  inplace_op().redispatch(ks & c10::after_autograd_keyset, q, k, cos, sin, unsqueeze_dim, mode, mrope_section, pairs,
                          pair_table);
}

void rotary_inplace_or_view(c10::DispatchKeySet ks, at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                            const at::Tensor& sin, int64_t unsqueeze_dim, c10::string_view mode,
                            c10::optional<at::IntArrayRef> mrope_section, c10::string_view pairs, bool pair_table) {
  inplace_op().redispatch(ks & c10::after_ADInplaceOrView_keyset, q, k, cos, sin, unsqueeze_dim, mode, mrope_section,
                          pairs, pair_table);
  torch::autograd::impl::bump_version(q);
  torch::autograd::impl::bump_version(k);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opgym, m) {
  m.def("rotary(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1, str mode=\"hf\", "
        "int[]? mrope_section=None, str pairs=\"half\", bool pair_table=False, bool contiguous=False) "
        "-> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  // `rotary_mode`: auto_functionalized's helper takes a parameter named `mode` (see rms_norm_).
  m.def("rotary_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, int unsqueeze_dim=1, str rotary_mode=\"hf\", "
        "int[]? mrope_section=None, str pairs=\"half\", bool pair_table=False) -> ()",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("rotary", &rotary_cpu);
  m.impl("rotary_", &rotary_inplace_cpu);
}
TORCH_LIBRARY_IMPL(opgym, Meta, m) {
  m.impl("rotary", &rotary_meta);
  m.impl("rotary_", &rotary_inplace_meta);
}
TORCH_LIBRARY_IMPL(opgym, Autograd, m) {
  m.impl("rotary", &rotary_autograd);
  m.impl("rotary_", &rotary_inplace_autograd);
}
TORCH_LIBRARY_IMPL(opgym, ADInplaceOrView, m) { m.impl("rotary_", &rotary_inplace_or_view); }
