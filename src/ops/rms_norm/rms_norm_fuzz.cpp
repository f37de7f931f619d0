// libFuzzer target: opgym::rms_norm's C++ entry on views drawn from the fuzzer's bytes (shapes,
// strides, dtypes, eps, modes, sum orders, ISAs, threads, in place, overlapping and misaligned
// outputs, empty and 1-element tensors). A call either throws opgym::Error having written nothing, or
// writes only out, and then equals the basic-op golden computed on copies of its inputs.
// Built with -DOPGYM_FUZZ=ON (clang); `make test-fuzz` runs it on fuzz/corpus/rms_norm.
#include <cmath>
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
  const TensorView w_like = fuzz::row_vector_like(x);
  const TensorView w = fuzz::draw_view(f, a, &w_like, fuzz::draw_dtype(f));
  const DType od = f.ConsumeIntegralInRange(0, 9) == 9 ? fuzz::draw_dtype(f) : rms_norm_out_dtype(x.dtype, w.dtype);
  const TensorView out_drawn = fuzz::draw_view(f, a, &x, od);
  const TensorView out = f.ConsumeBool() ? x : out_drawn;
  RmsNormOptions o;
  o.eps = f.ConsumeIntegralInRange(0, 9) == 9 ? f.ConsumeFloatingPoint<double>() : 1e-6;
  o.mode = f.ConsumeBool() ? NormMode::hf : NormMode::fp32;
  o.weight_offset = f.ConsumeIntegralInRange(0, 5) == 5;
  o.sum_order = f.ConsumeBool() ? SumOrder::automatic : SumOrder::lanes64;
  const CpuIsa isa = static_cast<CpuIsa>(f.ConsumeIntegralInRange(0, 2));
  set_cpu_isa(cpu_supports(isa) ? isa : CpuIsa::scalar);
  Executor* ex = f.ConsumeBool() ? pool.get() : nullptr;
  a.fill(f);  // the values: whatever bytes are left

  // The golden on copies of the inputs, before the call may overwrite them (in place).
  std::vector<unsigned char> xc, wc, gc;
  bool golden_ok = false;
  if (fuzz::readable(x) && fuzz::readable(w) && out.rank == x.rank) {
    xc = fuzz::gather(x), wc = fuzz::gather(w), gc.resize(xc.size() / dtype_size(x.dtype) * dtype_size(out.dtype));
    try {
      TensorView g = fuzz::contiguous_like(x, gc);
      g.dtype = out.dtype;  // the op computes into out's dtype when it accepts it
      reference::rms_norm_basic_ops(fuzz::contiguous_like(x, xc), fuzz::contiguous_like(w, wc), g, o);
      golden_ok = true;
    } catch (const Error&) {
    }
  }
  const auto before = fuzz::snapshot(a);
  const std::string why = fuzz::refusal([&] { rms_norm(x, w, out, o, ex); });
  const bool threw = !why.empty();
  fuzz::count(threw ? why.c_str() : nullptr, !threw && golden_ok && fuzz::readable(out));
  fuzz::check_writes(a, before, {out}, threw);
  if (!threw && golden_ok && fuzz::readable(out) && !fuzz::same_elements(out.dtype, fuzz::gather(out), gc)) {
    std::fprintf(stderr, "opgym fuzz: rms_norm's result differs from the golden's (mode %d, order %d, isa %d, eps %g)\n",
                 static_cast<int>(o.mode), static_cast<int>(o.sum_order), static_cast<int>(active_cpu_isa()), o.eps);
    fuzz::describe("x", x, a), fuzz::describe("weight", w, a), fuzz::describe("out", out, a);
    if (std::getenv("OPGYM_FUZZ_DEBUG")) {
      const auto got = fuzz::gather(out);
      const size_t es = dtype_size(out.dtype), xs = dtype_size(x.dtype), ws = dtype_size(w.dtype);
      for (size_t i = 0; i * es < got.size(); ++i) {
        uint32_t g = 0, e = 0, xv = 0, wv = 0;
        std::memcpy(&g, &got[i * es], es), std::memcpy(&e, &gc[i * es], es);
        std::memcpy(&xv, &xc[(i * xs) % xc.size()], xs), std::memcpy(&wv, &wc[(i * ws) % wc.size()], ws);
        std::fprintf(stderr, "  [%zu] got %08x want %08x x %08x w %08x\n", i, g, e, xv, wv);
      }
    }
    __builtin_trap();  // a result the golden does not give
  }
  return 0;
}
