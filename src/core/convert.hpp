// Scalar dtype conversions, bit-exact with torch (c10::BFloat16 / c10::Half): round to nearest even,
// NaN kept NaN, subnormals kept. Internal; every function has internal linkage on purpose: this
// header is included by translation units compiled for different instruction sets, and a shared
// inline copy could be resolved to the AVX-512 build and run on a CPU without it.
#pragma once
#include <cstdint>
#include <cstring>

namespace opgym {
namespace {  // NOLINT(google-build-namespaces): see the header comment

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN (sign dropped, as torch's scalar path)
  u += 0x7fffu + ((u >> 16) & 1u);                     // ties to even; overflow carries into inf
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in fp32
    return bits_f32(f32_bits(static_cast<float>(man) * 5.9604644775390625e-08f) | sign);
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf (ties to even)
  if (u >= 0x38800000u) {                       // normal half: rebias exponent, round mantissa
    u += 0xc8000fffu + ((u >> 13) & 1u);
    return sign | static_cast<uint16_t>(u >> 13);
  }
  // Subnormal or zero: adding 0.5f aligns the value to multiples of 2^-24 (the half subnormal
  // step) with the FPU's round-to-nearest-even; the low bits are then the half encoding.
  const float aligned = bits_f32(u) + 0.5f;
  return sign | static_cast<uint16_t>(f32_bits(aligned) - 0x3f000000u);
}

}  // namespace
}  // namespace opgym
