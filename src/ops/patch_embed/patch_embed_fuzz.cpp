// libFuzzer target: opgym::patch_embed_pack and patch_embed on drawn views (see rms_norm_fuzz.cpp): x [P, K] and
// weight [OC, K] of drawn shapes (K = in_channels * positions, or not), layouts and dtypes; a bias or none; out
// drawn like [P, OC] (overlapping x or the bias now and then); the form; a drawn in_channels; a packed buffer of
// the wrong size or with a damaged header; paths (ISA, the CPU's own AMX/VDPBF16PS or the emulation), threads.
// The values are the fuzzer's bytes (NaN, inf, denormals). A call either throws opgym::Error having written
// nothing, or writes only out and equals, bit for bit (NaN == NaN), the golden computed on copies.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cases/fuzz_arena.hpp"
#include "opgym/opgym.hpp"

using namespace opgym;  // NOLINT

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Executor> pool = make_thread_pool(2);
  FuzzedDataProvider f(data, size);
  fuzz::Arena a;
  const DType dt = static_cast<DType>(f.ConsumeIntegralInRange(0, 2) == 0 ? 2 : f.ConsumeIntegralInRange(0, 2));
  const int64_t ic = 1 + f.ConsumeIntegralInRange(0, 5) % 6;
  const int64_t npos = 1 + f.ConsumeIntegralInRange(0, 8);
  const int64_t P = f.ConsumeIntegralInRange<int64_t>(0, 40), OC = 1 + f.ConsumeIntegralInRange<int64_t>(0, 69);
  TensorView x_like = TensorView::contiguous(nullptr, dt, {P, ic * npos});
  TensorView w_like = TensorView::contiguous(nullptr, dt, {OC, ic * npos});
  const TensorView x = fuzz::draw_view(f, a, &x_like, f.ConsumeIntegralInRange(0, 15) == 15 ? fuzz::draw_dtype(f) : dt, 2);
  const TensorView w = fuzz::draw_view(f, a, &w_like, f.ConsumeIntegralInRange(0, 15) == 15 ? fuzz::draw_dtype(f) : dt, 2);
  const bool has_bias = f.ConsumeBool();
  TensorView b_like = TensorView::contiguous(nullptr, dt, {OC});
  TensorView bias = has_bias ? fuzz::draw_view(f, a, &b_like, f.ConsumeIntegralInRange(0, 15) == 15 ? fuzz::draw_dtype(f) : dt) : TensorView{};
  TensorView o_like = TensorView::contiguous(nullptr, dt, {P, OC});
  const int ok = f.ConsumeIntegralInRange(0, 20);
  const TensorView out = ok == 20 ? x : ok == 19 && has_bias ? bias
                       : fuzz::draw_view(f, a, &o_like, ok == 18 ? fuzz::draw_dtype(f) : dt, 2);
  const PatchEmbedForm form = static_cast<PatchEmbedForm>(f.ConsumeIntegralInRange(0, 2));
  const int64_t in_channels = f.ConsumeIntegralInRange(0, 30) == 30 ? f.ConsumeIntegralInRange<int64_t>(0, 40) : ic;
  const int damage = f.ConsumeIntegralInRange(0, 20);  // 20: a header byte flipped; 19: one byte short
  const size_t damage_at = f.ConsumeIntegralInRange<size_t>(0, 55);
  const CpuIsa isa = static_cast<CpuIsa>(f.ConsumeIntegralInRange(0, 2));
  set_cpu_isa(cpu_supports(isa) ? isa : CpuIsa::scalar);
  PatchEmbedOptions o;
  o.hardware = f.ConsumeBool();
  Executor* ex = f.ConsumeBool() ? pool.get() : nullptr;
  a.fill(f);  // the values: whatever bytes are left

  // The pack, from the weight as it is now (before the call may overwrite nothing of it: out never aliases it
  // here, and an overlap with x or bias is refused).
  std::vector<unsigned char> packed;
  bool packed_ok = false;
  try {
    const int64_t n = patch_embed_packed_bytes(w, in_channels, form);
    if (n <= (int64_t{1} << 24)) {
      packed.resize(static_cast<size_t>(n));
      patch_embed_pack(w, in_channels, form, packed.data(), n);
      packed_ok = true;
    }
  } catch (const Error&) {
  }
  if (!packed_ok) return 0;
  if (damage == 20) packed[damage_at] ^= static_cast<unsigned char>(1u << (damage_at % 8));
  const int64_t given = static_cast<int64_t>(packed.size()) - (damage == 19 ? 1 : 0);

  std::vector<unsigned char> xc, wc, bc, want;
  bool golden_ok = false;
  if (fuzz::readable(x) && fuzz::readable(w) && (!has_bias || fuzz::readable(bias)) && out.rank == 2 && x.rank == 2) {
    xc = fuzz::gather(x), wc = fuzz::gather(w);
    if (has_bias) bc = fuzz::gather(bias);
    want.resize(static_cast<size_t>(x.shape[0] * w.shape[0]) * dtype_size(out.dtype));
    try {
      TensorView bv = has_bias ? fuzz::contiguous_like(bias, bc) : TensorView{};
      TensorView wv = TensorView::contiguous(want.data(), out.dtype, {x.shape[0], w.shape[0]});
      reference::patch_embed_basic_ops(fuzz::contiguous_like(x, xc), fuzz::contiguous_like(w, wc), in_channels,
                                       has_bias ? &bv : nullptr, wv, form);
      golden_ok = true;
    } catch (const Error&) {
    }
  }
  const auto before = fuzz::snapshot(a);
  const std::string why =
      fuzz::refusal([&] { patch_embed(x, packed.data(), given, has_bias ? &bias : nullptr, out, o, ex); });
  const bool threw = !why.empty();
  const bool compare = !threw && golden_ok && fuzz::readable(out) && damage < 19;
  fuzz::count(threw ? why.c_str() : nullptr, compare);
  fuzz::check_writes(a, before, {out}, threw);
  if (!threw && damage >= 19) {
    std::fprintf(stderr, "opgym fuzz: patch_embed took a damaged packed weight (%d at %zu)\n", damage, damage_at);
    __builtin_trap();
  }
  if (compare && (out.shape[0] != x.shape[0] || out.shape[1] != w.shape[0] || out.dtype != x.dtype ||
                  !fuzz::same_elements(out.dtype, fuzz::gather(out), want))) {
    std::fprintf(stderr, "opgym fuzz: patch_embed's result differs from the golden's (%s, hardware %d)\n",
                 patch_embed_form_name(form), int(o.hardware));
    fuzz::describe("x", x, a), fuzz::describe("out", out, a);
    __builtin_trap();
  }
  return 0;
}
