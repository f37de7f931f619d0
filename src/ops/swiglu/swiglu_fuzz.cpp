// libFuzzer target: opgym::swiglu and opgym::swiglu_merged's C++ entries on drawn views (see
// rms_norm_fuzz.cpp): gate, up and out of drawn layouts and dtypes, or gate_up [..., 2I] with out
// [..., I]; out in place on gate or up (on gate_up's halves when merged), up the very tensor gate is,
// overlapping and misaligned views; torch_threads (invalid ones included), gate_layout (contiguous,
// as_given, invalid), activation (silu, gelu_tanh, invalid), ISAs, threads. A call
// either throws opgym::Error having written nothing, or writes only out and equals, bit for bit,
// the basic-op golden computed on gate and up before the call (for merged, the halves cut here, not by
// the op's own split).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "cases/fuzz_arena.hpp"
#include "opgym/opgym.hpp"

using namespace opgym;  // NOLINT

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Executor> pool = make_thread_pool(2);
  FuzzedDataProvider f(data, size);
  fuzz::Arena a;
  const bool merged = f.ConsumeBool();
  const DType dt = fuzz::draw_dtype(f);
  TensorView gate, up, gate_up;
  if (!merged) {
    gate = fuzz::draw_view(f, a, nullptr, dt);
    const int u = f.ConsumeIntegralInRange(0, 15);
    up = u == 15 ? gate : fuzz::draw_view(f, a, &gate, u == 14 ? fuzz::draw_dtype(f) : dt);
  } else {
    // gate_up drawn like a [..., I] shape with its last dim doubled (drawn dims may still make it odd).
    fuzz::Arena shape_only;
    TensorView like = fuzz::draw_view(f, shape_only, nullptr, dt);
    if (like.rank >= 1 && like.rank <= kMaxRank) like.shape[like.rank - 1] *= 2;
    gate_up = fuzz::draw_view(f, a, &like, dt);
    gate = up = gate_up;
    if (gate_up.rank >= 1 && gate_up.rank <= kMaxRank) {
      const int64_t i = gate_up.last_dim() / 2;
      gate.shape[gate.rank - 1] = up.shape[up.rank - 1] = i;
      if (gate_up.data) up.data = static_cast<char*>(gate_up.data) + i * static_cast<int64_t>(dtype_size(dt));
    }
  }
  const int o_kind = f.ConsumeIntegralInRange(0, 9);
  const TensorView out = o_kind == 8   ? gate
                         : o_kind == 9 ? up
                                       : fuzz::draw_view(f, a, &gate, o_kind == 7 ? fuzz::draw_dtype(f) : dt);
  SwigluOptions o;
  const int tt = f.ConsumeIntegralInRange(0, 20);
  o.torch_threads = tt == 20 ? -f.ConsumeIntegralInRange(0, 2) : 1 + tt;  // 1 by default; 2..20; 0, -1, -2
  o.gate_layout = static_cast<GateLayout>(f.ConsumeIntegralInRange(0, 2));  // contiguous, as_given, invalid
  o.activation = static_cast<GluActivation>(f.ConsumeIntegralInRange(0, 2));  // silu, gelu_tanh, invalid
  const CpuIsa isa = static_cast<CpuIsa>(f.ConsumeIntegralInRange(0, 2));
  set_cpu_isa(cpu_supports(isa) ? isa : CpuIsa::scalar);
  Executor* ex = f.ConsumeBool() ? pool.get() : nullptr;
  a.fill(f);  // the values: whatever bytes are left

  // The golden before the call may overwrite the inputs (in place), on the views themselves (with
  // gate_layout as_given, where torch's tails fall depends on gate's strides) into a buffer of its own;
  // copies of the inputs are kept for the report.
  std::vector<unsigned char> gc, uc, want;
  bool golden_ok = false;
  if (fuzz::readable(gate) && fuzz::readable(up) && out.rank == gate.rank) {
    gc = fuzz::gather(gate), uc = fuzz::gather(up);
    want.resize(gc.size() / dtype_size(gate.dtype) * dtype_size(out.dtype));
    try {
      TensorView w = fuzz::contiguous_like(gate, want);
      w.dtype = out.dtype;  // the golden refuses what the op must refuse: another dtype than gate's
      reference::swiglu_basic_ops(gate, up, w, o);
      golden_ok = true;
    } catch (const Error&) {
    }
  }
  const auto before = fuzz::snapshot(a);
  const std::string why = fuzz::refusal([&] {
    if (merged) swiglu_merged(gate_up, out, o, ex);
    else swiglu(gate, up, out, o, ex);
  });
  const bool threw = !why.empty();
  const bool compare = !threw && golden_ok && fuzz::readable(out);
  fuzz::count(threw ? why.c_str() : nullptr, compare);
  fuzz::check_writes(a, before, {out}, threw);
  if (compare) {
    const auto got = fuzz::gather(out);
    if (!fuzz::same_elements(out.dtype, got, want)) {
      std::fprintf(stderr, "opgym fuzz: swiglu%s's result differs from the golden's (isa %d, torch_threads %d, %s)\n",
                   merged ? "_merged" : "", static_cast<int>(active_cpu_isa()), o.torch_threads,
                   glu_activation_name(o.activation));
      if (merged) fuzz::describe("gate_up", gate_up, a);
      fuzz::describe("gate", gate, a), fuzz::describe("up", up, a), fuzz::describe("out", out, a);
      const size_t es = dtype_size(out.dtype);  // = gate's and up's (the golden accepted them)
      const bool all = std::getenv("OPGYM_FUZZ_DEBUG") != nullptr;
      for (size_t i = 0, shown = 0; i * es < got.size() && (all || shown < 16); ++i) {
        if (!all && std::memcmp(&got[i * es], &want[i * es], es) == 0) continue;
        ++shown;
        uint32_t g = 0, e = 0, gv = 0, uv = 0;
        std::memcpy(&g, &got[i * es], es), std::memcpy(&e, &want[i * es], es);
        std::memcpy(&gv, &gc[i * es], es), std::memcpy(&uv, &uc[i * es], es);
        std::fprintf(stderr, "  [%zu] got %08x want %08x gate %08x up %08x\n", i, g, e, gv, uv);
      }
      __builtin_trap();  // a result the golden does not give
    }
  }
  return 0;
}
