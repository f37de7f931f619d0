// A non-owning view of a strided tensor: what every opgym op takes. Strides are in elements; only
// the last dim must be contiguous (stride 1), every other dim may have any non-negative stride,
// so a [T, H] slice of a [T, 2H] buffer is a valid input. Counts and offsets are 64-bit.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "opgym/dtype.hpp"

namespace opgym {

constexpr int kMaxRank = 8;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::float32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};  // in elements

  // A contiguous (row-major) view. Throws opgym::Error for a rank outside 1..8 or a negative dim.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape);
  static TensorView contiguous(void* data, DType dtype, const int64_t* shape, int rank);
  // A view with explicit strides (elements), as torch's Tensor.stride() gives them.
  static TensorView strided(void* data, DType dtype, const int64_t* shape, const int64_t* strides,
                            int rank);

  int64_t numel() const;          // product of the dims (1 for... rank >= 1 only)
  int64_t last_dim() const { return shape[rank - 1]; }
  int64_t rows() const;           // numel / last dim; 0 when any dim is 0
  bool is_contiguous() const;
  std::string shape_str() const;  // "[1, 4096, 2048]"
};

}  // namespace opgym
