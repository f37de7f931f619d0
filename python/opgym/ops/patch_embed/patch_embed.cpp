// opgym::patch_embed's CPU kernels on torch's stable ABI (built into opgym/_stable.so; src/ops/patch_embed is the
// core). Schemas, fake kernels and autograd rules: meta.py beside this file.
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
// No backward: the Autograd kernel (meta.py) refuses where a gradient is needed (opgym.patch runs HF's conv then).
#include <optional>
#include <string>
#include <vector>

#include "csrc/stable.hpp"
#include "opgym/opgym.hpp"

namespace {

using namespace opgym_stable;  // NOLINT(google-build-using-namespace): the shared helpers

opgym::PatchEmbedForm form_of(const std::string& form) {
  opgym::PatchEmbedForm f = opgym::PatchEmbedForm::fma_chain;
  translate_errors("patch_embed_pack", [&] { f = opgym::parse_patch_embed_form(form); });
  return f;
}

// The 2-D view [rows, rest] of a tensor whose inner dims are one contiguous row (a copy where they are not).
Tensor as_rows(const Tensor& t, const char* name, const char* op) {
  OPGYM_CHECK_VALUE(t.dim() >= 2, "opgym::", op, ": ", name, " must have at least 2 dims, got ", sizes_of(t));
  return torch::stable::reshape(t, {t.size(0), -1});
}

Tensor patch_embed_pack_cpu(Tensor weight, std::string form, int64_t in_channels) {
  check_tensor_arg(weight, "weight", "patch_embed_pack");
  OPGYM_CHECK(weight.is_cpu(), "opgym::patch_embed_pack: weight must be on the CPU, got ", device_name(weight));
  OPGYM_CHECK_VALUE(in_channels > 0 || weight.dim() >= 3, "opgym::patch_embed_pack: in_channels is needed for a ",
                    weight.dim(), "-D weight (a Conv3d weight [OC, C, T, H, W] gives it)");
  const int64_t ic = in_channels > 0 ? in_channels : weight.size(1);
  const Tensor w = as_rows(weight, "weight", "patch_embed_pack");
  const opgym::PatchEmbedForm f = form_of(form);
  Tensor packed;
  translate_errors("patch_embed_pack", [&] {
    const opgym::TensorView wv = view_of(w);
    const int64_t n = opgym::patch_embed_packed_bytes(wv, ic, f);
    packed = torch::stable::empty({n}, ScalarType::Byte);
    opgym::patch_embed_pack(wv, ic, f, packed.data_ptr(), n);
  });
  return packed;
}

void check_patch_embed(const Tensor& x, const Tensor& packed, int64_t out_channels, const std::optional<Tensor>& bias) {
  constexpr const char* op = "patch_embed";
  check_tensor_arg(x, "x", op);
  OPGYM_CHECK_VALUE(x.dim() >= 2, "opgym::patch_embed: x must be [P, ...] with at least 2 dims, got ", sizes_of(x));
  OPGYM_CHECK_VALUE(packed.defined() && packed.dim() == 1 && packed.scalar_type() == ScalarType::Byte,
                    "opgym::patch_embed: packed must be the 1-D uint8 tensor patch_embed_pack returns");
  check_device(packed, "packed", x, "x", op);
  OPGYM_CHECK_VALUE(out_channels >= 1, "opgym::patch_embed: out_channels must be >= 1, got ", out_channels);
  if (bias.has_value()) {
    check_tensor_arg(*bias, "bias", op);
    check_device(*bias, "bias", x, "x", op);
    OPGYM_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == out_channels, "opgym::patch_embed: bias must be [",
                      out_channels, "], got ", sizes_of(*bias));
    OPGYM_CHECK_VALUE(bias->scalar_type() == x.scalar_type(), "opgym::patch_embed: bias must have x's dtype ",
                      dtype_name(x.scalar_type()), ", got ", dtype_name(bias->scalar_type()));
  }
}

Tensor patch_embed_cpu(Tensor x, Tensor packed, int64_t out_channels, std::optional<Tensor> bias, bool hardware) {
  check_patch_embed(x, packed, out_channels, bias);
  const Tensor xr = as_rows(x, "x", "patch_embed");
  const Tensor p = torch::stable::contiguous(packed);
  Tensor out = empty_output(std::vector<int64_t>{x.size(0), out_channels}, x.scalar_type());
  Tensor b;
  opgym::TensorView bv;
  if (bias.has_value()) b = torch::stable::contiguous(*bias), bv = view_of(b);
  opgym::PatchEmbedOptions o;
  o.hardware = hardware;
  translate_errors("patch_embed", [&] {
    opgym::patch_embed(view_of(xr), p.data_ptr(), p.numel(), bias.has_value() ? &bv : nullptr, view_of(out), o,
                       &executor());
  });
  return out;
}

std::string patch_embed_paths() { return opgym::patch_embed_paths(); }

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(opgym, CPU, m) {
  m.impl("patch_embed_pack", TORCH_BOX(&patch_embed_pack_cpu));
  m.impl("patch_embed", TORCH_BOX(&patch_embed_cpu));
}

STABLE_TORCH_LIBRARY_IMPL(opgym_internal, CompositeExplicitAutograd, m) {
  m.impl("patch_embed_paths", TORCH_BOX(&patch_embed_paths));
}
