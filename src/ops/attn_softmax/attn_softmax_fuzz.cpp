// libFuzzer target: opgym::attn_softmax and attn_softmax_segments' C++ entries on drawn views (see
// rms_norm_fuzz.cpp): scores and out of drawn layouts and dtypes, out in place on scores, overlapping and
// misaligned views; a mask drawn like scores with broadcast (size-1) dims, another dtype, or none; scale
// (NaN, inf, 0 now and then); the segmented form with drawn cu_seqlens (uneven, empty, invalid) packed or
// block diagonal; torch builds (ISAs), threads. A call either throws opgym::Error having written nothing,
// or writes only out and equals, bit for bit (NaN == NaN), the basic-op golden computed on copies.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
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
  const DType dt = fuzz::draw_dtype(f);
  const TensorView scores = fuzz::draw_view(f, a, nullptr, dt);
  const int o_kind = f.ConsumeIntegralInRange(0, 9);
  const TensorView out =
      o_kind == 9 ? scores : fuzz::draw_view(f, a, &scores, o_kind == 8 ? fuzz::draw_dtype(f) : dt);
  const bool segmented = f.ConsumeIntegralInRange(0, 3) == 3;
  // The mask: like scores, with some dims set to 1 (broadcast) before the strides are drawn.
  TensorView mask;
  const bool has_mask = !segmented ? f.ConsumeIntegralInRange(0, 2) != 0 : f.ConsumeIntegralInRange(0, 15) == 15;
  if (has_mask) {
    TensorView like = scores;
    if (like.rank >= 1 && like.rank <= kMaxRank)
      for (int d = 0; d < like.rank; ++d)
        if (f.ConsumeIntegralInRange(0, 3) == 3 && (d < like.rank - 1 || f.ConsumeIntegralInRange(0, 7) == 7))
          like.shape[d] = 1;
    const int mk = f.ConsumeIntegralInRange(0, 15);
    mask = fuzz::draw_view(f, a, &like, mk == 15 ? fuzz::draw_dtype(f) : dt);
  }
  AttnSoftmaxOptions o;
  const int sk = f.ConsumeIntegralInRange(0, 20);
  o.scale = sk == 20 ? std::numeric_limits<float>::quiet_NaN() : sk == 19 ? std::numeric_limits<float>::infinity()
            : sk == 18 ? 0.0f : 0.08838834764831845f * static_cast<float>(1 + sk);
  o.mask = has_mask ? &mask : nullptr;
  // Segments over scores' second-to-last dim P: drawn lengths summing to P (or not, now and then).
  std::vector<int64_t> cu;
  bool diag = false;
  if (segmented) {
    diag = f.ConsumeBool();
    const int64_t P = scores.rank >= 2 && scores.rank <= kMaxRank ? scores.shape[scores.rank - 2] : 1;
    cu.push_back(0);
    while (cu.back() < P && cu.size() < 40) cu.push_back(std::min<int64_t>(P, cu.back() + f.ConsumeIntegralInRange<int64_t>(0, 9)));
    if (cu.size() == 1) cu.push_back(P);
    const int odd = f.ConsumeIntegralInRange(0, 30);
    if (odd == 30) cu.back() += 1;                               // past P
    if (odd == 29 && cu.size() > 2) std::swap(cu[1], cu[2]);     // out of order
    if (odd == 28) cu.resize(1);                                 // no segment
  }
  const int isa = f.ConsumeIntegralInRange(0, 3);  // 3: unset (the active ISA)
  if (isa < 3) o.torch_isa = static_cast<CpuIsa>(isa);
  set_cpu_isa(cpu_supports(CpuIsa::avx2) ? CpuIsa::avx2 : CpuIsa::scalar);
  Executor* ex = f.ConsumeBool() ? pool.get() : nullptr;
  a.fill(f);  // the values: whatever bytes are left

  // The golden on copies, before the call may overwrite scores (in place).
  std::vector<unsigned char> sc, mc, want;
  bool golden_ok = false;
  if (fuzz::readable(scores) && (!has_mask || fuzz::readable(mask)) && out.rank == scores.rank) {
    sc = fuzz::gather(scores);
    TensorView mcv;
    if (has_mask) mc = fuzz::gather(mask), mcv = fuzz::contiguous_like(mask, mc);
    want.resize(sc.size() / dtype_size(scores.dtype) * dtype_size(out.dtype));
    try {
      TensorView w = fuzz::contiguous_like(scores, want);
      w.dtype = out.dtype;  // the golden refuses what the op must refuse: another dtype than scores'
      AttnSoftmaxOptions go = o;
      go.mask = has_mask ? &mcv : nullptr;
      if (segmented)
        reference::attn_softmax_segments_basic_ops(fuzz::contiguous_like(scores, sc), w, cu.data(),
                                                   static_cast<int64_t>(cu.size()) - 1, diag, go);
      else
        reference::attn_softmax_basic_ops(fuzz::contiguous_like(scores, sc), w, go);
      golden_ok = true;
    } catch (const Error&) {
    }
  }
  const auto before = fuzz::snapshot(a);
  const std::string why = fuzz::refusal([&] {
    if (segmented) attn_softmax_segments(scores, out, cu.data(), static_cast<int64_t>(cu.size()) - 1, diag, o, ex);
    else attn_softmax(scores, out, o, ex);
  });
  const bool threw = !why.empty();
  const bool compare = !threw && golden_ok && fuzz::readable(out);
  fuzz::count(threw ? why.c_str() : nullptr, compare);
  fuzz::check_writes(a, before, {out}, threw);
  if (compare) {
    const auto got = fuzz::gather(out);
    if (!fuzz::same_elements(out.dtype, got, want)) {
      std::fprintf(stderr, "opgym fuzz: attn_softmax%s's result differs from the golden's (torch_isa %d)\n",
                   segmented ? "_segments" : "", isa);
      fuzz::describe("scores", scores, a), fuzz::describe("out", out, a);
      if (has_mask) fuzz::describe("mask", mask, a);
      __builtin_trap();  // a result the golden does not give
    }
  }
  return 0;
}
