// Comparing an output with its golden: the figures the precision runner prints.
#pragma once
#include <cstdint>

#include "cases/inputs.hpp"

namespace opgym::cases {

struct Metrics {
  int64_t count = 0;
  double max_abs = 0;       // max |got - want| (inf where exactly one side is NaN or the infs differ)
  double max_rel = 0;       // max |got - want| / |want| over elements with want != 0
  int64_t max_ulp = 0;      // max distance in representable values of the dtype
  double identical = 1.0;   // share of bit-identical elements (NaN == NaN counts as identical)
  int64_t not_close = 0;    // elements failing |got - want| <= atol + rtol * |want|
  bool allclose() const { return not_close == 0; }
};

// got and want: same shape and dtype (contiguous buffers).
Metrics compare(const Buffer& got, const Buffer& want, double rtol, double atol);
// The figures of two compared outputs taken together (an op with two outputs reports one line).
Metrics merge(const Metrics& a, const Metrics& b);
// Distance in representable values between two encodings of `dtype` (0 for equal, NaN-aware).
int64_t ulp_distance(DType dtype, uint32_t a_bits, uint32_t b_bits);

}  // namespace opgym::cases
