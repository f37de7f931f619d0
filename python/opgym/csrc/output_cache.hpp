// The per-torch library's functional CPU operators take their outputs from the block pool
// (block_pool.hpp: why, and the limits).
#pragma once
#include <ATen/ATen.h>

namespace opgym_torch {

// A contiguous CPU tensor for an operator's output, its storage a pooled block (resizable: a larger
// size goes through the same allocator).
at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace opgym_torch
