// libFuzzer target: opgym::add_rms_norm's C++ entry on drawn views (see rms_norm_fuzz.cpp): in place
// (out = x, sum_out = residual), aliasing of x and residual, overlapping outputs. A call either throws
// opgym::Error having written nothing, or writes only out and sum_out and equals the golden.
#include <memory>
#include <string>

#include "cases/fuzz_arena.hpp"
#include "opgym/opgym.hpp"

using namespace opgym;  // NOLINT

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Executor> pool = make_thread_pool(2);
  FuzzedDataProvider f(data, size);
  fuzz::Arena a;
  const TensorView x = fuzz::draw_view(f, a, nullptr, fuzz::draw_dtype(f));
  const TensorView r = f.ConsumeIntegralInRange(0, 9) == 9 ? x : fuzz::draw_view(f, a, &x, f.ConsumeIntegralInRange(0, 7) == 7 ? fuzz::draw_dtype(f) : x.dtype);
  const TensorView w_like = fuzz::row_vector_like(x);
  const TensorView w = fuzz::draw_view(f, a, &w_like, fuzz::draw_dtype(f));
  const DType od = rms_norm_out_dtype(x.dtype, w.dtype);
  const bool in_place = f.ConsumeBool();
  const TensorView out = in_place ? x : fuzz::draw_view(f, a, &x, f.ConsumeIntegralInRange(0, 9) == 9 ? fuzz::draw_dtype(f) : od);
  const TensorView sum = in_place ? r : fuzz::draw_view(f, a, &x, f.ConsumeIntegralInRange(0, 9) == 9 ? fuzz::draw_dtype(f) : x.dtype);
  RmsNormOptions o;
  o.eps = f.ConsumeIntegralInRange(0, 9) == 9 ? f.ConsumeFloatingPoint<double>() : 1e-6;
  o.mode = f.ConsumeBool() ? NormMode::hf : NormMode::fp32;
  const CpuIsa isa = static_cast<CpuIsa>(f.ConsumeIntegralInRange(0, 2));
  set_cpu_isa(cpu_supports(isa) ? isa : CpuIsa::scalar);
  Executor* ex = f.ConsumeBool() ? pool.get() : nullptr;
  a.fill(f);  // the values: whatever bytes are left

  std::vector<unsigned char> xc, rc, wc, gc, gs;
  bool golden_ok = false;
  if (fuzz::readable(x) && fuzz::readable(r) && fuzz::readable(w) && r.rank == x.rank) {
    xc = fuzz::gather(x), rc = fuzz::gather(r), wc = fuzz::gather(w);
    gc.resize(xc.size() / dtype_size(x.dtype) * dtype_size(out.dtype)), gs.resize(xc.size());
    try {
      TensorView go = fuzz::contiguous_like(x, gc);
      go.dtype = out.dtype;  // the op computes into out's dtype when it accepts it
      TensorView rv = fuzz::contiguous_like(r, rc);
      reference::add_rms_norm_basic_ops(fuzz::contiguous_like(x, xc), rv, fuzz::contiguous_like(w, wc), go,
                                        fuzz::contiguous_like(x, gs), o);
      golden_ok = true;
    } catch (const Error&) {
    }
  }
  const auto before = fuzz::snapshot(a);
  const std::string why = fuzz::refusal([&] { add_rms_norm(x, r, w, out, sum, o, ex); });
  const bool threw = !why.empty();
  fuzz::count(threw ? why.c_str() : nullptr, !threw && golden_ok && fuzz::readable(out));
  fuzz::check_writes(a, before, {out, sum}, threw);
  if (!threw && golden_ok && fuzz::readable(out) &&
      (!fuzz::same_elements(out.dtype, fuzz::gather(out), gc) || !fuzz::same_elements(x.dtype, fuzz::gather(sum), gs)))
    __builtin_trap();
  return 0;
}
