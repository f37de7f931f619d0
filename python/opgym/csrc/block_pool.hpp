// The blocks behind opgym's functional CPU operators' outputs, reused across calls (torch-free: the
// stable-ABI library wraps a block with torch::stable::from_blob, the per-torch one with a DataPtr).
//
// Why: torch's CPU allocator takes a large block from glibc, which maps fresh pages for it (always
// above 32 MiB, and below that whenever its heap was trimmed) and unmaps them when the tensor dies.
// Each call's output then starts unmapped: writing a 32 MiB output costs 8192 page faults and the
// kernel's zeroing of every page, 4-5x the normalization itself on this project's CI machine
// (docs/PERF.md, v19). Like torch's CUDA caching allocator, the pool keeps the blocks of freed outputs
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
#include <cstddef>
#include <cstdint>

namespace opgym_torch {

struct OutputCacheInfo {
  int64_t limit_bytes, cached_bytes, cached_blocks, hits, misses;
};

struct PoolBlock;  // opaque: what release() takes back

// One process-wide pool per library that links this file.
class BlockPool {
 public:
  // A block of at least n > 0 bytes (64-byte aligned; page-aligned from 1 MiB); nullptr when the
  // memory is not there even after freeing what the pool holds. *block receives the handle.
  static void* acquire(size_t n, PoolBlock** block);
  static void release(PoolBlock* block);  // thread-safe; the block is cached or freed
  static OutputCacheInfo info();
  static void set_limit(int64_t bytes);  // evicts down to the new limit; 0 disables the pool
  static void clear();
};

}  // namespace opgym_torch
