// Outputs of opgym's functional CPU operators, reused across calls.
//
// Why: torch's CPU allocator takes a large block from glibc, which maps fresh pages for it (always
// above 32 MiB, and below that whenever its heap was trimmed) and unmaps them when the tensor dies.
// Each call's output then starts unmapped: writing a 32 MiB output costs 8192 page faults and the
// kernel's zeroing of every page, 4-5x the normalization itself on this project's CI machine
// (docs/PERF.md, v19). Like torch's CUDA caching allocator, this keeps the blocks of freed outputs
// (up to a byte limit, least recently freed evicted first) and gives the next request that fits one
// of them, pages already mapped.
//
// Requests of 1 MiB or more get page-aligned blocks, and a cached block serves requests from 7/8 of
// its size up to its size. Smaller requests (a decode step's outputs) are cached too, in exact 64-byte
// size classes, at most 64 blocks, the most recently freed handed out first (still in cache): glibc's
// malloc and free of a 4 KiB output were ~0.2 us of a 2.8 us torch.ops decode call (docs/PERF.md, v24).
// The limit starts at OPGYM_OUTPUT_CACHE_MB (default 256; 0 turns the cache off) and is changed by
// opgym.set_output_cache_limit(); opgym.empty_output_cache() frees every block held.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace opgym_torch {

// A contiguous CPU tensor for an operator's output, from the cache when the size qualifies.
at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype);

struct OutputCacheInfo {
  int64_t limit_bytes, cached_bytes, cached_blocks, hits, misses;
};
OutputCacheInfo output_cache_info();
void set_output_cache_limit(int64_t bytes);  // evicts down to the new limit; 0 disables the cache
void empty_output_cache();

}  // namespace opgym_torch
