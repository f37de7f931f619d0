// The README's C++ example: normalize a [2, 4096] bf16 tensor in place with a bf16 weight.
#include <opgym/opgym.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  const int64_t rows = 2, dim = 4096;
  std::vector<uint16_t> x(rows * dim, 0x3f80);  // bf16 1.0
  std::vector<uint16_t> w(dim, 0x4000);         // bf16 2.0
  for (int64_t i = 0; i < dim; i += 2) x[i] = 0xbf80;  // -1.0: rms stays 1

  auto xv = opgym::TensorView::contiguous(x.data(), opgym::DType::bfloat16, {rows, dim});
  auto wv = opgym::TensorView::contiguous(w.data(), opgym::DType::bfloat16, {dim});
  try {
    opgym::rms_norm(xv, wv, xv, {/*eps=*/1e-6});  // out == x: in place; mode hf (HF eager bits)
  } catch (const opgym::Error& e) {
    std::fprintf(stderr, "%s (argument: %s)\n", e.what(), e.argument().c_str());
    return 2;
  }
  // 1 / sqrt(1 + 1e-6) rounds to 1.0 in bf16, times 2.0: every element is +-2.0.
  const bool ok = x[0] == 0xc000 && x[1] == 0x4000;
  std::printf("x[0..1] = 0x%04x 0x%04x on %s: %s\n", x[0], x[1], opgym::isa_name(opgym::active_cpu_isa()),
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
