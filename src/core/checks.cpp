#include "core/checks.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

namespace opgym::detail {

namespace {
std::string pre(const char* op, const char* name) { return std::string(op) + ": " + name; }

// Bytes from the first to one past the last element; 0 for an empty view.
int64_t extent_bytes(const TensorView& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) last += (t.shape[d] - 1) * t.strides[d];
  return (last + 1) * static_cast<int64_t>(dtype_size(t.dtype));
}
}  // namespace

void check_view(const TensorView& t, const char* name, const char* op, bool need_data) {
  if (t.rank < 1 || t.rank > kMaxRank)
    throw Error(name, pre(op, name) + " must have rank 1 to " + std::to_string(kMaxRank) + ", got rank " +
                          std::to_string(t.rank) + (t.rank == 0 ? " (a scalar)" : ""));
  if (t.dtype != DType::float32 && t.dtype != DType::float16 && t.dtype != DType::bfloat16)
    throw Error(name, pre(op, name) + " has an unsupported dtype, expected float32, float16 or bfloat16");
  int64_t n = 1, far = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0)
      throw Error(name, pre(op, name) + ".shape[" + std::to_string(d) + "] must be >= 0, got " + std::to_string(t.shape[d]));
    if (t.strides[d] < 0)
      throw Error(name, pre(op, name) + ".strides[" + std::to_string(d) + "] must be >= 0, got " + std::to_string(t.strides[d]));
    if (t.shape[d] > 0 && __builtin_mul_overflow(n, t.shape[d], &n))
      throw Error(name, pre(op, name) + " has more than 2^63 elements: " + t.shape_str());
    int64_t span;
    if (t.shape[d] > 0 && (__builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &span) || __builtin_add_overflow(far, span, &far)))
      throw Error(name, pre(op, name) + " spans more than 2^63 elements with strides as given");
  }
  if (t.last_dim() > 1 && t.strides[t.rank - 1] != 1)
    throw Error(name, pre(op, name) + " must be contiguous in its last dim (stride 1), got stride " +
                          std::to_string(t.strides[t.rank - 1]));
  if (need_data && t.data == nullptr && t.numel() > 0) throw Error(name, pre(op, name) + " has no data (null pointer)");
  // Elements are read as their type: an address off the element size is undefined behaviour in C++
  // (found by the fuzzers on the scalar path), and torch never makes such a tensor.
  if (t.data != nullptr && reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) != 0)
    throw Error(name, pre(op, name) + " data must be aligned to its element size (" + std::to_string(dtype_size(t.dtype)) +
                          " bytes)");
}

void check_no_self_overlap(const TensorView& t, const char* name, const char* op) {
  // Sort the non-trivial dims by stride; each stride must clear the extent of the dims inside it.
  std::array<int, kMaxRank> dims{};
  int k = 0;
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1) dims[k++] = d;
  for (int i = 1; i < k; ++i)  // insertion sort by stride: at most 8 dims
    for (int j = i; j > 0 && t.strides[dims[j]] < t.strides[dims[j - 1]]; --j) std::swap(dims[j], dims[j - 1]);
  int64_t extent = 1;
  for (int i = 0; i < k; ++i) {
    const int d = dims[i];
    if (t.strides[d] < extent)
      throw Error(name, pre(op, name) + " has overlapping elements (stride " + std::to_string(t.strides[d]) +
                            " of dim " + std::to_string(d) + " is smaller than the span inside it); it must not alias itself");
    extent = t.strides[d] * (t.shape[d] - 1) + extent;
  }
}

bool same_memory(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d)
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  return true;
}

void check_disjoint(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name, const char* op) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  const auto a1 = a0 + static_cast<uintptr_t>(extent_bytes(a)), b1 = b0 + static_cast<uintptr_t>(extent_bytes(b));
  if (a0 < b1 && b0 < a1)
    throw Error(b_name, std::string(op) + ": " + b_name + " overlaps " + a_name +
                            " in memory; pass the very same tensor for in place, or disjoint memory");
}

bool leading_collapse(const TensorView& t, int64_t& row_stride) {
  row_stride = t.last_dim();
  int inner = -1;
  for (int d = t.rank - 2; d >= 0; --d) {
    if (t.shape[d] == 1) continue;
    if (inner < 0) row_stride = t.strides[d];
    else if (t.strides[d] != t.strides[inner] * t.shape[inner]) return false;
    inner = d;
  }
  return true;
}

}  // namespace opgym::detail
