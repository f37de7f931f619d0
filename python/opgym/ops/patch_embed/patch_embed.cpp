// opgym::patch_embed's torch operators (src/ops/patch_embed): schemas, CPU, Meta and Autograd kernels.
//
//   opgym::patch_embed_pack(Tensor weight, str form, int in_channels=-1) -> Tensor
//       The Conv3d weight [OC, C, T, H, W] (or [OC, K] with in_channels given) packed for `form` ("amx_tile",
//       "dot_pairs", "fma_chain"): a uint8 tensor of patch_embed_packed_bytes; pack once per weight.
//   opgym::patch_embed(Tensor x, Tensor packed, int out_channels, Tensor? bias=None, bool hardware=True) -> Tensor
//       x [P, C, T, H, W] (or [P, K]) in the weight's dtype -> [P, out_channels]: the patch embedding with the
//       reduction of the packed form (include/opgym/patch_embed.hpp). hardware=False: the FMA emulation of the
//       AMX / VDPBF16PS forms (same bits; tests).
//   opgym_internal::patch_embed_paths() -> str       what the calls run on this CPU
//
// No backward: the Autograd kernel refuses where a gradient is needed (opgym.patch runs HF's conv then).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "csrc/output_cache.hpp"
#include "csrc/torch_common.hpp"
#include "opgym/opgym.hpp"

namespace {

using namespace opgym_torch;  // NOLINT(google-build-using-namespace): the shared helpers

opgym::PatchEmbedForm form_of(c10::string_view form) {
  opgym::PatchEmbedForm f = opgym::PatchEmbedForm::fma_chain;
  translate_errors("patch_embed_pack", [&] { f = opgym::parse_patch_embed_form(std::string(form)); });
  return f;
}

// The 2-D view [rows, rest] of a tensor whose inner dims are one contiguous row (a copy where they are not).
at::Tensor as_rows(const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK_VALUE(t.dim() >= 2, "opgym::", op, ": ", name, " must have at least 2 dims, got ", t.sizes());
  return t.reshape({t.size(0), -1});
}

at::Tensor patch_embed_pack_cpu(const at::Tensor& weight, c10::string_view form, int64_t in_channels) {
  check_tensor_arg(weight, "weight", "patch_embed_pack");
  TORCH_CHECK(weight.device().is_cpu(), "opgym::patch_embed_pack: weight must be on the CPU, got ", weight.device());
  TORCH_CHECK_VALUE(in_channels > 0 || weight.dim() >= 3, "opgym::patch_embed_pack: in_channels is needed for a ",
                    weight.dim(), "-D weight (a Conv3d weight [OC, C, T, H, W] gives it)");
  const int64_t ic = in_channels > 0 ? in_channels : weight.size(1);
  const at::Tensor w = as_rows(weight, "weight", "patch_embed_pack");
  const opgym::PatchEmbedForm f = form_of(form);
  at::Tensor packed;
  translate_errors("patch_embed_pack", [&] {
    const opgym::TensorView wv = view_of(w);
    const int64_t n = opgym::patch_embed_packed_bytes(wv, ic, f);
    packed = at::empty({n}, at::TensorOptions().dtype(at::kByte));
    opgym::patch_embed_pack(wv, ic, f, packed.data_ptr(), n);
  });
  return packed;
}

void check_patch_embed(const at::Tensor& x, const at::Tensor& packed, int64_t out_channels,
                       const c10::optional<at::Tensor>& bias) {
  constexpr const char* op = "patch_embed";
  check_tensor_arg(x, "x", op);
  TORCH_CHECK_VALUE(x.dim() >= 2, "opgym::patch_embed: x must be [P, ...] with at least 2 dims, got ", x.sizes());
  TORCH_CHECK_VALUE(packed.defined() && packed.dim() == 1 && packed.scalar_type() == at::kByte,
                    "opgym::patch_embed: packed must be the 1-D uint8 tensor patch_embed_pack returns");
  check_device(packed, "packed", x, "x", op);
  TORCH_CHECK_VALUE(out_channels >= 1, "opgym::patch_embed: out_channels must be >= 1, got ", out_channels);
  if (bias.has_value()) {
    check_tensor_arg(*bias, "bias", op);
    check_device(*bias, "bias", x, "x", op);
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == out_channels, "opgym::patch_embed: bias must be [",
                      out_channels, "], got ", bias->sizes());
    TORCH_CHECK_VALUE(bias->scalar_type() == x.scalar_type(), "opgym::patch_embed: bias must have x's dtype ",
                      x.scalar_type(), ", got ", bias->scalar_type());
  }
}

at::Tensor patch_embed_cpu(const at::Tensor& x, const at::Tensor& packed, int64_t out_channels,
                           const c10::optional<at::Tensor>& bias, bool hardware) {
  check_patch_embed(x, packed, out_channels, bias);
  const at::Tensor xr = as_rows(x, "x", "patch_embed");
  const at::Tensor p = packed.contiguous();
  at::Tensor out = empty_output({x.size(0), out_channels}, x.scalar_type());
  at::Tensor b;
  opgym::TensorView bv;
  if (bias.has_value()) b = bias->contiguous(), bv = view_of(b);
  opgym::PatchEmbedOptions o;
  o.hardware = hardware;
  translate_errors("patch_embed", [&] {
    opgym::patch_embed(view_of(xr), p.data_ptr(), p.numel(), bias.has_value() ? &bv : nullptr, view_of(out), o,
                       &aten_executor());
  });
  return out;
}

at::Tensor patch_embed_meta(const at::Tensor& x, const at::Tensor& packed, int64_t out_channels,
                            const c10::optional<at::Tensor>& bias, bool) {
  check_patch_embed(x, packed, out_channels, bias);
  return at::empty_symint({x.sym_size(0), c10::SymInt(out_channels)}, x.options());
}

at::Tensor patch_embed_autograd(c10::DispatchKeySet ks, const at::Tensor& x, const at::Tensor& packed,
                                int64_t out_channels, const c10::optional<at::Tensor>& bias, bool hardware) {
  TORCH_CHECK(!grad_needed({&x}) && !(bias.has_value() && grad_needed({&*bias})),
              "opgym::patch_embed has no backward (an inference kernel); call it under torch.no_grad(), or use the "
              "module's own Conv3d where gradients are needed");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opgym::patch_embed", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t,
                                               const c10::optional<at::Tensor>&, bool)>();
  return op.redispatch(ks & c10::after_autograd_keyset, x, packed, out_channels, bias, hardware);
}

// Packing reads the weight's values; its uint8 result has no gradient (a Parameter's weight packs as is).
at::Tensor patch_embed_pack_autograd(c10::DispatchKeySet ks, const at::Tensor& weight, c10::string_view form,
                                     int64_t in_channels) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opgym::patch_embed_pack", "")
                             .typed<at::Tensor(const at::Tensor&, c10::string_view, int64_t)>();
  return op.redispatch(ks & c10::after_autograd_keyset, weight, form, in_channels);
}

std::string patch_embed_paths() { return opgym::patch_embed_paths(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(opgym, m) {
  m.def("patch_embed_pack(Tensor weight, str form, int in_channels=-1) -> Tensor", {at::Tag::pt2_compliant_tag});
  m.def("patch_embed(Tensor x, Tensor packed, int out_channels, Tensor? bias=None, bool hardware=True) -> Tensor",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("patch_embed_pack", &patch_embed_pack_cpu);
  m.impl("patch_embed", &patch_embed_cpu);
}
TORCH_LIBRARY_IMPL(opgym, Meta, m) { m.impl("patch_embed", &patch_embed_meta); }
TORCH_LIBRARY_IMPL(opgym, Autograd, m) {
  m.impl("patch_embed", &patch_embed_autograd);
  m.impl("patch_embed_pack", &patch_embed_pack_autograd);
}

TORCH_LIBRARY_FRAGMENT(opgym_internal, m) { m.def("patch_embed_paths() -> str", &patch_embed_paths); }
