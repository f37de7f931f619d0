// Storage tags: how each dtype is held in memory and converted to and from fp32 (scalar form).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

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

// One element by runtime dtype, as fp32 (the goldens and other scalar code).
inline float load_as_f32(DType t, const void* base, int64_t off) {
  return with_storage(t, [&](auto tag) {
    using T = decltype(tag);
    return T::to_f32(static_cast<const typename T::storage*>(base)[off]);
  });
}
inline void store_from_f32(DType t, void* base, int64_t off, float v) {
  with_storage(t, [&](auto tag) {
    using T = decltype(tag);
    static_cast<typename T::storage*>(base)[off] = T::from_f32(v);
  });
}
// v rounded to dtype t (RNE) and back to fp32.
inline float round_to(DType t, float v) {
  return with_storage(t, [&](auto tag) { using T = decltype(tag); return T::to_f32(T::from_f32(v)); });
}

// The first n (< S::kGroup) elements of a group through a zero-padded scratch group: the rest read
// as zero and are not written. For groups without masked loads and stores (scalar, AVX2).
template <class S, class T> typename S::G load_n_padded(const typename T::storage* p, int64_t n) {
  alignas(64) typename T::storage buf[S::kGroup] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(buf[0]));
  return S::template load<T>(buf);
}
template <class S, class T> void store_n_padded(typename T::storage* p, const typename S::G& g, int64_t n) {
  alignas(64) typename T::storage buf[S::kGroup];
  S::template store<T>(buf, g);
  std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(buf[0]));
}

// A whole group (n == S::kGroup) or its first n elements (S's own partial loads and stores).
template <class S, class T> typename S::G load_some(const typename T::storage* p, int64_t n) {
  return n == S::kGroup ? S::template load<T>(p) : S::template load_n<T>(p, n);
}
template <class S, class T> void store_some(typename T::storage* p, const typename S::G& g, int64_t n) {
  if (n == S::kGroup) S::template store<T>(p, g);
  else S::template store_n<T>(p, g, n);
}

}  // namespace
}  // namespace opgym
