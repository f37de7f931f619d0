// patch_embed against its golden on every form x dtype x path (the CPU's AMX / VDPBF16PS where present and the
// FMA emulations on avx512, avx2 and scalar) x shape (rows around the 32-row blocks, channel counts around the
// 32-channel blocks, odd and even in_channels, one and many kernel positions) x bias x threads x row strides;
// on inputs built to make every rounding count (large terms that cancel), on denormal-range products (DAZ/FTZ
// as the instructions do them), and on NaN/inf. Every error refuses before writing. Against torch's own
// convolution: tests/test_patch_embed.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cases/compare.hpp"
#include "cases/inputs.hpp"
#include "core/storage.hpp"
#include "opgym/opgym.hpp"

namespace opgym {
namespace {

using cases::Buffer;

const PatchEmbedForm kForms[] = {PatchEmbedForm::amx_tile, PatchEmbedForm::dot_pairs, PatchEmbedForm::fma_chain};
const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

enum class Kind { normal, cancel, tiny, special };

// [rows, n] of dtype t. normal: N(0, s^2) with per-element exponents spread over 2^-6..2^6; cancel: at every
// kernel position channels 0 and 1 give products +B and -B (B = 2^18..2^21, powers of two: x = 2^10, the
// weights +-2^(8..11)) and the other channels products near 1: the accumulator is a small sum with fraction
// bits that each +B/-B pair snaps to B's ulp, differently by the order of the two (the binade of c+B is not
// the one of c-B) and by the AMX form's separate even/odd sums, so every order gives its own bits on most
// outputs; tiny: magnitudes near 2^-63 (products near the fp32 denormal range); special: a few NaN/inf
// among normals.
Buffer values(int64_t rows, int64_t n, int64_t npos, DType t, uint64_t seed, Kind kind, bool is_weight) {
  Buffer b = cases::make_buffer({rows, n}, t);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> z(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-6, 6), et(-70, -56);
  const int64_t ic = n / npos;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ic; ++c)
      for (int64_t p = 0; p < npos; ++p) {
        float v = z(g) * std::ldexp(1.0f, kind == Kind::cancel ? e(g) / 3 : e(g));
        if (kind == Kind::tiny) v = z(g) * std::ldexp(1.0f, et(g));
        if (kind == Kind::cancel && c < 2 && ic > 2)
          v = is_weight ? (c == 0 ? 1.0f : -1.0f) * std::ldexp(1.0f, 8 + static_cast<int>(p % 4)) : 1024.0f;
        if (kind == Kind::special && (r * 7 + c * 3 + p) % 997 == 5) v = (p % 2 ? 1.0f : -1.0f) * INFINITY;
        if (kind == Kind::special && (r * 11 + p) % 1499 == 7) v = NAN;
        store_from_f32(t, b.bytes.data(), r * n + c * npos + p, v);
      }
  return b;
}

void expect_same(const Buffer& got, const Buffer& want, const std::string& what) {
  const cases::Metrics m = cases::compare(got, want, 0, 0);  // NaN == NaN
  ASSERT_EQ(m.max_ulp, 0) << what << ": " << (1.0 - m.identical) * static_cast<double>(m.count) << " of " << m.count
                          << " outputs differ";
}

int64_t count_differ(const Buffer& a, const Buffer& b) {
  const cases::Metrics m = cases::compare(a, b, 0, 0);
  return static_cast<int64_t>(std::llround((1.0 - m.identical) * static_cast<double>(m.count)));
}

struct Paths {
  std::vector<std::pair<CpuIsa, bool>> all;  // (active ISA, hardware)
  Paths() {
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512})
      if (cpu_supports(isa)) {
        all.push_back({isa, false});
        if (isa == CpuIsa::avx512) all.push_back({isa, true});
      }
  }
};

struct IsaRestore {
  CpuIsa saved = active_cpu_isa();
  ~IsaRestore() { set_cpu_isa(saved); }
};

// One configuration through every path, against the golden.
void check_all_paths(PatchEmbedForm form, DType t, int64_t P, int64_t OC, int64_t IC, int64_t NPOS, bool bias,
                     Kind kind, uint64_t seed, int64_t x_pad = 0, int64_t out_pad = 0) {
  const int64_t K = IC * NPOS;
  Buffer xb = values(P, K + x_pad, NPOS, t, seed, kind, false);
  Buffer wb = values(OC, K, NPOS, t, seed + 1, kind == Kind::special ? Kind::normal : kind, true);
  Buffer bb = values(1, OC, 1, t, seed + 2, Kind::normal, false);
  const int64_t xs[2] = {P, K}, xst[2] = {K + x_pad, 1};
  const TensorView x = TensorView::strided(xb.bytes.data(), t, xs, xst, 2);
  const TensorView w = wb.view();
  TensorView bv = TensorView::contiguous(bb.bytes.data(), t, {OC});
  Buffer want = cases::make_buffer({P, OC + out_pad}, t);
  const int64_t os[2] = {P, OC}, ost[2] = {OC + out_pad, 1};
  reference::patch_embed_basic_ops(x, w, IC, bias ? &bv : nullptr,
                                   TensorView::strided(want.bytes.data(), t, os, ost, 2), form);
  const int64_t n = patch_embed_packed_bytes(w, IC, form);
  std::vector<unsigned char> packed(static_cast<size_t>(n));
  patch_embed_pack(w, IC, form, packed.data(), n);
  IsaRestore restore;
  auto pool = make_thread_pool(3);
  for (auto [isa, hw] : Paths().all) {
    for (Executor* ex : {&serial_executor(), pool.get()}) {
      set_cpu_isa(isa);
      Buffer got = cases::make_buffer({P, OC + out_pad}, t);
      std::memset(got.bytes.data(), 0x5a, got.bytes.size());
      PatchEmbedOptions o;
      o.hardware = hw;
      patch_embed(x, packed.data(), n, bias ? &bv : nullptr, TensorView::strided(got.bytes.data(), t, os, ost, 2), o, ex);
      // the padding columns of out untouched
      for (int64_t r = 0; r < P; ++r)
        for (int64_t c = OC; c < OC + out_pad; ++c)
          ASSERT_EQ(got.bytes[(r * (OC + out_pad) + c) * dtype_size(t)], 0x5a);
      for (int64_t r = 0; r < P; ++r)
        std::memset(got.bytes.data() + (r * (OC + out_pad) + OC) * dtype_size(t), 0, out_pad * dtype_size(t));
      expect_same(got, want,
                  std::string(patch_embed_form_name(form)) + " " + dtype_name(t) + " P" + std::to_string(P) + " OC" +
                      std::to_string(OC) + " IC" + std::to_string(IC) + " NPOS" + std::to_string(NPOS) +
                      (bias ? " bias" : "") + " on " + isa_name(isa) + (hw ? " (hardware)" : "") +
                      (ex == pool.get() ? " 3 threads" : " 1 thread") + " kind " + std::to_string(int(kind)));
    }
  }
}

TEST(PatchEmbed, EveryPathIsTheGoldenOnSmallShapes) {
  uint64_t seed = 1;
  for (PatchEmbedForm form : kForms)
    for (DType t : kDtypes) {
      if (!patch_embed_form_supports(form, t)) continue;
      for (int64_t P : {1, 5, 31, 32, 33, 70})
        for (int64_t OC : {1, 16, 33, 64})
          for (int64_t IC : {1, 2, 3, 5})
            for (int64_t NPOS : {1, 7}) check_all_paths(form, t, P, OC, IC, NPOS, (P + OC) % 2 == 0, Kind::normal, seed++);
    }
}

TEST(PatchEmbed, QwenShapeCancellationDenormalsAndSpecials) {
  // Qwen2.5-VL's: in 3, kernel (2, 14, 14) = 392 positions, 1280 channels (a slice of them: 96 and 80).
  uint64_t seed = 1000;
  for (PatchEmbedForm form : kForms)
    for (DType t : kDtypes) {
      if (!patch_embed_form_supports(form, t)) continue;
      for (Kind kind : {Kind::normal, Kind::cancel, Kind::tiny, Kind::special})
        check_all_paths(form, t, 45, kind == Kind::normal ? 96 : 80, 3, 392, kind != Kind::tiny, kind, seed++, 5, 3);
    }
}

TEST(PatchEmbed, TheFormsAreTellApartOnCancellingInputs) {
  // The goldens are not all one arithmetic: on inputs whose partial sums cancel, each pair of bf16 forms
  // differs on most outputs (so a test comparing a path with the wrong form fails).
  const int64_t P = 16, OC = 64, IC = 3, NPOS = 392, K = IC * NPOS;
  const DType t = DType::bfloat16;
  Buffer xb = values(P, K, NPOS, t, 7, Kind::cancel, false), wb = values(OC, K, NPOS, t, 8, Kind::cancel, true);
  Buffer out[3] = {cases::make_buffer({P, OC}, t), cases::make_buffer({P, OC}, t), cases::make_buffer({P, OC}, t)};
  for (int f = 0; f < 3; ++f) reference::patch_embed_basic_ops(xb.view(), wb.view(), IC, nullptr, out[f].view(), kForms[f]);
  EXPECT_GT(count_differ(out[0], out[1]), P * OC / 4);
  EXPECT_GT(count_differ(out[0], out[2]), P * OC / 4);
  EXPECT_GT(count_differ(out[1], out[2]), P * OC / 4);
}

TEST(PatchEmbed, ReportsItsPaths) {
  const std::string p = patch_embed_paths();
  EXPECT_NE(p.find("amx_tile: "), std::string::npos) << p;
  // Where the CPU has AMX-BF16 on Linux the permission is granted (Linux >= 5.16 grants it on request).
  EXPECT_EQ(patch_embed_amx_usable(), p.find("amx (tiles granted)") != std::string::npos) << p;
  if (patch_embed_dot_bf16_usable()) {
    EXPECT_NE(p.find("dot_pairs: avx512_bf16"), std::string::npos) << p;
  }
}

TEST(PatchEmbed, PackedInfoAndSizes) {
  Buffer w = cases::make_buffer({1280, 1176}, DType::bfloat16);
  EXPECT_EQ(patch_embed_packed_bytes(w.view(), 3, PatchEmbedForm::amx_tile), 64 + 1280 * 392 * 4 * 2);
  EXPECT_EQ(patch_embed_packed_bytes(w.view(), 3, PatchEmbedForm::fma_chain), 64 + 1280 * 392 * 3 * 4);
  const int64_t n = patch_embed_packed_bytes(w.view(), 3, PatchEmbedForm::dot_pairs);
  std::vector<unsigned char> packed(static_cast<size_t>(n));
  patch_embed_pack(w.view(), 3, PatchEmbedForm::dot_pairs, packed.data(), n);
  const PatchEmbedPackedInfo info = patch_embed_packed_info(packed.data(), n);
  EXPECT_EQ(info.form, PatchEmbedForm::dot_pairs);
  EXPECT_EQ(info.dtype, DType::bfloat16);
  EXPECT_EQ(info.out_channels, 1280);
  EXPECT_EQ(info.in_channels, 3);
  EXPECT_EQ(info.positions, 392);
  EXPECT_EQ(parse_patch_embed_form("amx_tile"), PatchEmbedForm::amx_tile);
  EXPECT_THROW(parse_patch_embed_form("conv"), Error);
}

// Throws naming `arg`, and writes nothing into `guard`.
template <class Fn>
void expect_refused(Fn&& fn, const std::string& arg, const Buffer& guard) {
  const std::vector<unsigned char, cases::Aligned64<unsigned char>> before = guard.bytes;
  try {
    fn();
    FAIL() << "no error (expected one naming " << arg << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), arg) << e.what();
  }
  EXPECT_TRUE(before == guard.bytes) << "written on error (" << arg << ")";
}

TEST(PatchEmbed, ErrorsNameTheArgumentAndWriteNothing) {
  const DType t = DType::bfloat16;
  Buffer x = values(4, 24, 8, t, 1, Kind::normal, false), w = values(8, 24, 8, t, 2, Kind::normal, true);
  Buffer out = cases::make_buffer({4, 8}, t), b = cases::make_buffer({8}, t);
  const int64_t n = patch_embed_packed_bytes(w.view(), 3, PatchEmbedForm::amx_tile);
  std::vector<unsigned char> packed(static_cast<size_t>(n));
  patch_embed_pack(w.view(), 3, PatchEmbedForm::amx_tile, packed.data(), n);
  const TensorView bv = b.view();
  auto call = [&](const TensorView& xv, const TensorView& ov, const TensorView* bias, const void* p, int64_t pn) {
    return [=] { patch_embed(xv, p, pn, bias, ov, {}, &serial_executor()); };
  };
  expect_refused(call(x.view(), out.view(), nullptr, nullptr, n), "packed", out);
  expect_refused(call(x.view(), out.view(), nullptr, packed.data(), n - 1), "packed", out);
  std::vector<unsigned char> bad = packed;
  bad[20] ^= 1;  // the header's form/dtype fields changed: its check fails
  expect_refused(call(x.view(), out.view(), nullptr, bad.data(), n), "packed", out);
  Buffer x32 = values(4, 24, 8, DType::float32, 1, Kind::normal, false);
  expect_refused(call(x32.view(), out.view(), nullptr, packed.data(), n), "x", out);
  Buffer xk = values(4, 21, 7, t, 1, Kind::normal, false);
  expect_refused(call(xk.view(), out.view(), nullptr, packed.data(), n), "x", out);
  Buffer o2 = cases::make_buffer({4, 9}, t);
  expect_refused(call(x.view(), o2.view(), nullptr, packed.data(), n), "out", o2);
  Buffer b2 = cases::make_buffer({9}, t);
  const TensorView b2v = b2.view();
  expect_refused(call(x.view(), out.view(), &b2v, packed.data(), n), "bias", out);
  // out overlapping x
  TensorView alias = x.view();
  alias.shape[1] = 8;
  expect_refused(call(x.view(), alias, nullptr, packed.data(), n), "out", x);
  // out overlapping itself (stride 0 rows)
  TensorView self = out.view();
  self.strides[0] = 0;
  expect_refused(call(x.view(), self, nullptr, packed.data(), n), "out", out);
  // the pack's own checks
  std::vector<unsigned char> p2(static_cast<size_t>(n));
  EXPECT_THROW(patch_embed_pack(w.view(), 5, PatchEmbedForm::amx_tile, p2.data(), n), Error);       // 5 does not divide 24
  EXPECT_THROW(patch_embed_pack(w.view(), 3, PatchEmbedForm::amx_tile, p2.data(), n + 1), Error);   // size
  Buffer w32 = values(8, 24, 8, DType::float32, 2, Kind::normal, true);
  EXPECT_THROW(patch_embed_packed_bytes(w32.view(), 3, PatchEmbedForm::amx_tile), Error);          // bf16 only
  Buffer wide = cases::make_buffer({8, 33 * 2}, t);
  EXPECT_THROW(patch_embed_packed_bytes(wide.view(), 33, PatchEmbedForm::amx_tile), Error);       // > 32 channels
  EXPECT_NO_THROW(patch_embed_packed_bytes(wide.view(), 33, PatchEmbedForm::dot_pairs));
  // the golden refuses what the front refuses, out overlapping the weight included
  expect_refused([&] { reference::patch_embed_basic_ops(x.view(), w.view(), 3, &bv, o2.view(), PatchEmbedForm::amx_tile); },
                 "out", o2);
  TensorView wo = w.view();
  wo.shape[0] = 4;
  wo.shape[1] = 8;
  wo.strides[0] = 8;
  Buffer wcopy = w;
  expect_refused([&] { reference::patch_embed_basic_ops(x.view(), w.view(), 3, nullptr, wo, PatchEmbedForm::amx_tile); },
                 "out", w);
}

TEST(PatchEmbed, ZeroRowsWriteNothing) {
  const DType t = DType::float32;
  Buffer w = values(8, 24, 8, t, 2, Kind::normal, true);
  Buffer x = cases::make_buffer({0, 24}, t), out = cases::make_buffer({0, 8}, t);
  EXPECT_NO_THROW(patch_embed_unpacked(x.view(), w.view(), 3, nullptr, out.view(), PatchEmbedForm::fma_chain));
}

}  // namespace
}  // namespace opgym
