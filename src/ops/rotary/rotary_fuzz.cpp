// libFuzzer target: opgym::rotary's C++ entry on drawn views (see rms_norm_fuzz.cpp): q and k of
// drawn layouts (GQA, broadcast cos/sin, MRoPE tables), modes, unsqueeze_dim, sections, pairings,
// per-pair tables, rotary dims below the head dim (cos's width), in place, aliasing. A call either throws opgym::Error having written nothing, or writes only q_out and k_out
// and equals the golden.
#include <memory>
#include <string>

#include "cases/fuzz_arena.hpp"
#include "opgym/opgym.hpp"

using namespace opgym;  // NOLINT

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Executor> pool = make_thread_pool(2);
  FuzzedDataProvider f(data, size);
  fuzz::Arena a;
  const TensorView q = fuzz::draw_view(f, a, nullptr, fuzz::draw_dtype(f), 3);
  TensorView k = f.ConsumeIntegralInRange(0, 15) == 15 ? q : fuzz::draw_view(f, a, &q, q.dtype, 3);
  RotaryOptions o;
  o.mode = f.ConsumeBool() ? RotaryMode::hf : RotaryMode::fp32;
  const int ud = f.ConsumeIntegralInRange(0, 9);
  o.unsqueeze_dim = ud == 0 ? 1 : ud - 6;  // HF's 1 by default; -5..3 otherwise
  if (f.ConsumeIntegralInRange(0, 3) == 3)
    for (auto& s : o.mrope_section) s = f.ConsumeIntegralInRange<int64_t>(0, 40);
  // The pairing (0: rotate_half) and the table (0: one value per element); out-of-range values are refused.
  o.pairs = static_cast<RotaryPairs>(f.ConsumeIntegralInRange(0, 3) % 4);
  o.pair_table = f.ConsumeIntegralInRange(0, 3) == 3 || o.pairs == RotaryPairs::deinterleave;
  const int width_sel = f.ConsumeIntegralInRange(0, 7);  // 0: the whole head; else narrower, odd, wider
  // cos/sin like q without its head dim (HF's tables), or MRoPE's [3, ...]
  TensorView c_like = q;
  if (q.rank >= 2 && q.rank <= kMaxRank) {
    c_like.rank = q.rank - 1 + (o.mrope() ? 1 : 0);
    int src = 0;
    for (int d = 0; d < c_like.rank; ++d) {
      if (o.mrope() && d == 0) { c_like.shape[0] = 3; continue; }
      if (src == (o.unsqueeze_dim < 0 ? o.unsqueeze_dim + q.rank : o.unsqueeze_dim)) ++src;
      c_like.shape[d] = q.shape[src < q.rank ? src : q.rank - 1];
      ++src;
    }
    const int64_t D = q.shape[q.rank - 1], full = o.pair_table ? D / 2 : D;
    const int64_t widths[8] = {full, full / 2, full - 1, full + 1, 1, 0, full / 4, 2};
    c_like.shape[c_like.rank - 1] = widths[width_sel] < 0 ? 0 : widths[width_sel];
  }
  const DType cd = o.mode == RotaryMode::hf || !f.ConsumeBool() ? q.dtype : fuzz::draw_dtype(f);
  const TensorView c = fuzz::draw_view(f, a, &c_like, cd);
  const TensorView s = f.ConsumeIntegralInRange(0, 9) ? fuzz::draw_view(f, a, &c, cd) : c;
  const bool in_place = f.ConsumeBool();
  const TensorView qo = in_place ? q : fuzz::draw_view(f, a, &q, q.dtype);
  const TensorView ko = in_place ? k : fuzz::draw_view(f, a, &k, k.dtype);
  const CpuIsa isa = static_cast<CpuIsa>(f.ConsumeIntegralInRange(0, 2));
  set_cpu_isa(cpu_supports(isa) ? isa : CpuIsa::scalar);
  Executor* ex = f.ConsumeBool() ? pool.get() : nullptr;
  a.fill(f);  // the values: whatever bytes are left

  std::vector<unsigned char> qc, kc, cc, sc, gq, gk;
  bool golden_ok = false;
  if (fuzz::readable(q) && fuzz::readable(k) && fuzz::readable(c) && fuzz::readable(s)) {
    qc = fuzz::gather(q), kc = fuzz::gather(k), cc = fuzz::gather(c), sc = fuzz::gather(s);
    gq.resize(qc.size()), gk.resize(kc.size());
    try {
      reference::rotary_basic_ops(fuzz::contiguous_like(q, qc), fuzz::contiguous_like(k, kc), fuzz::contiguous_like(c, cc),
                                  fuzz::contiguous_like(s, sc), fuzz::contiguous_like(q, gq), fuzz::contiguous_like(k, gk), o);
      golden_ok = true;
    } catch (const Error&) {
    }
  }
  const auto before = fuzz::snapshot(a);
  const std::string why = fuzz::refusal([&] { rotary(q, k, c, s, qo, ko, o, ex); });
  const bool threw = !why.empty();
  fuzz::count(threw ? why.c_str() : nullptr, !threw && golden_ok && fuzz::readable(qo) && fuzz::readable(ko));
  fuzz::check_writes(a, before, {qo, ko}, threw);
  if (!threw && golden_ok && fuzz::readable(qo) && fuzz::readable(ko) &&
      (!fuzz::same_elements(q.dtype, fuzz::gather(qo), gq) || !fuzz::same_elements(k.dtype, fuzz::gather(ko), gk)))
    __builtin_trap();
  return 0;
}
