// Deterministic case inputs. Tensor k (0-based, in file order) of a case with seed s is filled from
// std::mt19937_64 seeded with s * 1000003 + k: pairs of 53-bit uniforms u1, u2 give standard normals
// by Box-Muller (sqrt(-2 ln(1 - u1)) * cos(2 pi u2), then * sin(2 pi u2)), scaled to mean + std * z
// and rounded to the dtype (nearest even). Every tensor is random, weights included.
#pragma once
#include <cstdint>
#include <new>
#include <vector>

#include "cases/case_file.hpp"
#include "opgym/tensor.hpp"

namespace opgym::cases {

// 64-byte aligned storage, as torch's CPU allocator gives it (kernels may use aligned stores on it).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U> Aligned64(const Aligned64<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <class U> bool operator==(const Aligned64<U>&) const { return true; }
  template <class U> bool operator!=(const Aligned64<U>&) const { return false; }
};

// An owned contiguous tensor.
struct Buffer {
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  std::vector<unsigned char, Aligned64<unsigned char>> bytes;
  TensorView view();
  int64_t numel() const;
  double at(int64_t i) const;  // element i as a double
};

Buffer make_buffer(const std::vector<int64_t>& shape, DType dtype);  // zero-filled
Buffer make_normal(const TensorSpec& spec, uint64_t seed, int index, double mean = 0.0, double std = 1.0);

}  // namespace opgym::cases
