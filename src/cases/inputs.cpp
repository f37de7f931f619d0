#include "cases/inputs.hpp"

#include <cmath>
#include <random>

#include "core/convert.hpp"
#include "opgym/error.hpp"

namespace opgym::cases {

TensorView Buffer::view() {
  return TensorView::contiguous(bytes.data(), dtype, shape.data(), static_cast<int>(shape.size()));
}

int64_t Buffer::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

double Buffer::at(int64_t i) const {
  switch (dtype) {
    case DType::float32: return reinterpret_cast<const float*>(bytes.data())[i];
    case DType::float16: return f16_to_f32(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
    case DType::bfloat16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
  }
  return 0;
}

Buffer make_buffer(const std::vector<int64_t>& shape, DType dtype) {
  Buffer b;
  b.dtype = dtype;
  b.shape = shape;
  b.bytes.assign(static_cast<size_t>(b.numel()) * dtype_size(dtype), 0);
  return b;
}

Buffer make_normal(const TensorSpec& spec, uint64_t seed, int index, double mean, double std) {
  Buffer b = make_buffer(spec.shape, spec.dtype);
  std::mt19937_64 gen(seed * 1000003ull + static_cast<uint64_t>(index));
  auto uniform = [&] { return static_cast<double>(gen() >> 11) * 0x1.0p-53; };
  const int64_t n = b.numel();
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < n; i += 2) {
    const double rad = std::sqrt(-2.0 * std::log(1.0 - uniform()));
    const double ang = kTwoPi * uniform();
    const double z[2] = {rad * std::cos(ang), rad * std::sin(ang)};
    for (int k = 0; k < 2 && i + k < n; ++k) {
      const float v = static_cast<float>(mean + std * z[k]);
      switch (spec.dtype) {
        case DType::float32: reinterpret_cast<float*>(b.bytes.data())[i + k] = v; break;
        case DType::float16: reinterpret_cast<uint16_t*>(b.bytes.data())[i + k] = f32_to_f16(v); break;
        case DType::bfloat16: reinterpret_cast<uint16_t*>(b.bytes.data())[i + k] = f32_to_bf16(v); break;
      }
    }
  }
  return b;
}

}  // namespace opgym::cases
