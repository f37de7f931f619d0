// Argument checks shared by every op's front. Each throws opgym::Error naming the argument.
#pragma once
#include "opgym/error.hpp"
#include "opgym/tensor.hpp"

namespace opgym::detail {

// rank 1..8, dims >= 0, strides >= 0, last dim contiguous, element count and extent fit in
// int64, data non-null when there are elements and aligned to the element size.
void check_view(const TensorView& t, const char* name, const char* op, bool need_data = true);
// No two elements of t share memory (needed for anything written).
void check_no_self_overlap(const TensorView& t, const char* name, const char* op);
// a and b are the very same elements (same pointer, dtype, shape and strides): in place.
bool same_memory(const TensorView& a, const TensorView& b);
// The byte ranges a and b span do not intersect.
void check_disjoint(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name, const char* op);

// Whether t's leading dims collapse to one row stride: skipping size-1 dims, each dim's stride is the
// next inner one's stride times that one's size. row_stride is then the innermost's stride (rows are
// then addressed as r * row_stride; otherwise a front unravels r over the leading dims).
bool leading_collapse(const TensorView& t, int64_t& row_stride);

}  // namespace opgym::detail
