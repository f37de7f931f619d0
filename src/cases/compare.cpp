#include "cases/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace opgym::cases {

namespace {
uint32_t bits_at(const Buffer& b, int64_t i) {
  if (b.dtype == DType::float32) {
    uint32_t u;
    std::memcpy(&u, b.bytes.data() + 4 * i, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, b.bytes.data() + 2 * i, 2);
  return h;
}
// Maps an encoding to an integer that is monotonic in the value (-0 and +0 both to 0).
int64_t ordered(DType t, uint32_t bits) {
  const int width = t == DType::float32 ? 32 : 16;
  const uint32_t sign = 1u << (width - 1), mag = bits & (sign - 1);
  return (bits & sign) ? -static_cast<int64_t>(mag) : static_cast<int64_t>(mag);
}
bool is_nan(DType t, uint32_t bits) {
  switch (t) {
    case DType::float32: return (bits & 0x7fffffffu) > 0x7f800000u;
    case DType::float16: return (bits & 0x7fffu) > 0x7c00u;
    case DType::bfloat16: return (bits & 0x7fffu) > 0x7f80u;
  }
  return false;
}
}  // namespace

int64_t ulp_distance(DType t, uint32_t a, uint32_t b) {
  const bool na = is_nan(t, a), nb = is_nan(t, b);
  if (na || nb) return na && nb ? 0 : std::numeric_limits<int64_t>::max();
  const int64_t d = ordered(t, a) - ordered(t, b);
  return d < 0 ? -d : d;
}

Metrics compare(const Buffer& got, const Buffer& want, double rtol, double atol) {
  Metrics m;
  m.count = want.numel();
  int64_t same = 0;
  for (int64_t i = 0; i < m.count; ++i) {
    const uint32_t ga = bits_at(got, i), wa = bits_at(want, i);
    const double g = got.at(i), w = want.at(i);
    const int64_t ulp = ulp_distance(want.dtype, ga, wa);
    if (ulp == 0) ++same;
    if (ulp > m.max_ulp) m.max_ulp = ulp;
    double abs_diff;
    if (ulp == 0) abs_diff = 0;
    else if (std::isnan(g) || std::isnan(w) || std::isinf(g) || std::isinf(w)) abs_diff = std::numeric_limits<double>::infinity();
    else abs_diff = std::fabs(g - w);
    if (abs_diff > m.max_abs) m.max_abs = abs_diff;
    if (w != 0 && abs_diff / std::fabs(w) > m.max_rel) m.max_rel = abs_diff / std::fabs(w);
    const bool close = ulp == 0 || (std::isfinite(abs_diff) && abs_diff <= atol + rtol * std::fabs(w));
    if (!close) ++m.not_close;
  }
  m.identical = m.count ? static_cast<double>(same) / static_cast<double>(m.count) : 1.0;
  return m;
}

Metrics merge(const Metrics& a, const Metrics& b) {
  Metrics m;
  m.count = a.count + b.count;
  m.max_abs = std::max(a.max_abs, b.max_abs);
  m.max_rel = std::max(a.max_rel, b.max_rel);
  m.max_ulp = std::max(a.max_ulp, b.max_ulp);
  m.identical = m.count ? (a.identical * static_cast<double>(a.count) + b.identical * static_cast<double>(b.count)) /
                              static_cast<double>(m.count)
                        : 1.0;
  m.not_close = a.not_close + b.not_close;
  return m;
}

}  // namespace opgym::cases
