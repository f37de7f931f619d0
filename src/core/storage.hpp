// Storage tags: how each dtype is held in memory and converted to and from fp32 (scalar form).
#pragma once
#include <cstdint>

#include "core/convert.hpp"
#include "opgym/dtype.hpp"

namespace opgym {
namespace {  // NOLINT: internal linkage per instruction set, see convert.hpp

struct F32 {
  using storage = float;
  static constexpr DType dtype = DType::float32;
  static float to_f32(float v) { return v; }
  static float from_f32(float v) { return v; }
};
struct F16 {
  using storage = uint16_t;
  static constexpr DType dtype = DType::float16;
  static float to_f32(uint16_t v) { return f16_to_f32(v); }
  static uint16_t from_f32(float v) { return f32_to_f16(v); }
};
struct BF16 {
  using storage = uint16_t;
  static constexpr DType dtype = DType::bfloat16;
  static float to_f32(uint16_t v) { return bf16_to_f32(v); }
  static uint16_t from_f32(float v) { return f32_to_bf16(v); }
};

// Calls fn(Tag{}) for the tag of a runtime dtype.
template <class Fn> decltype(auto) with_storage(DType t, Fn&& fn) {
  switch (t) {
    case DType::float16: return fn(F16{});
    case DType::bfloat16: return fn(BF16{});
    default: return fn(F32{});
  }
}

}  // namespace
}  // namespace opgym
