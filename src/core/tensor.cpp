#include "opgym/tensor.hpp"

#include <string>

#include "opgym/error.hpp"

namespace opgym {

namespace {
void check_rank_and_dims(const int64_t* shape, int rank) {
  if (rank < 1 || rank > kMaxRank)
    throw Error("rank", "tensor rank must be 1 to " + std::to_string(kMaxRank) + ", got " + std::to_string(rank));
  for (int d = 0; d < rank; ++d)
    if (shape[d] < 0)
      throw Error("shape", "shape[" + std::to_string(d) + "] must be >= 0, got " + std::to_string(shape[d]));
}
}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return contiguous(data, dtype, shape.begin(), static_cast<int>(shape.size()));
}

TensorView TensorView::contiguous(void* data, DType dtype, const int64_t* shape, int rank) {
  check_rank_and_dims(shape, rank);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = rank;
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides[d] = stride;
    stride *= shape[d] > 0 ? shape[d] : 1;
  }
  return v;
}

TensorView TensorView::strided(void* data, DType dtype, const int64_t* shape, const int64_t* strides, int rank) {
  check_rank_and_dims(shape, rank);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = rank;
  for (int d = 0; d < rank; ++d) {
    v.shape[d] = shape[d];
    v.strides[d] = strides[d];
  }
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

int64_t TensorView::rows() const {
  if (rank < 1 || last_dim() == 0) return 0;
  return numel() / last_dim();
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (int d = 0; d < rank; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

}  // namespace opgym
