// See block_pool.hpp for why the functional operators' outputs are pooled.
#include "block_pool.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace opgym_torch {
namespace {

constexpr size_t kLargeBytes = size_t{1} << 20;  // from here: page-aligned blocks, served from 7/8 of their size
constexpr size_t kAlign = 4096;
constexpr size_t kSmallAlign = 64;       // smaller requests: exact 64-byte size classes, ...
constexpr size_t kMaxSmallBlocks = 64;   // ... at most this many blocks held

struct Block {
  void* data;
  size_t bytes;  // a multiple of kAlign
};

class Pool {
 public:
  Pool() {
    limit_ = int64_t{256} << 20;
    if (const char* env = std::getenv("OPGYM_OUTPUT_CACHE_MB"); env && *env) {
      char* end = nullptr;
      const long long mb = std::strtoll(env, &end, 10);
      if (*end == '\0' && mb >= 0 && mb < (int64_t{1} << 40)) limit_ = static_cast<int64_t>(mb) << 20;
      else std::fprintf(stderr, "opgym: OPGYM_OUTPUT_CACHE_MB must be a whole number of MiB >= 0, got '%s'; using 256\n", env);
    }
  }

  void* acquire(size_t n, PoolBlock** out) {
    const bool small = n < kLargeBytes;
    const size_t align = small ? kSmallAlign : kAlign;
    const size_t bytes = (std::max<size_t>(n, 1) + align - 1) / align * align;
    Block* b = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (limit_ != 0) {
        b = small ? take_small(bytes) : take(bytes);
        if (b) ++hits_;
        else ++misses_;
      }
    }
    if (!b) {
      void* p = std::aligned_alloc(align, bytes);
      if (!p) {  // what the pool holds may be what is missing
        clear();
        p = std::aligned_alloc(align, bytes);
      }
      if (!p) return nullptr;
      b = new Block{p, bytes};
    }
    *out = reinterpret_cast<PoolBlock*>(b);
    return b->data;
  }

  OutputCacheInfo info() {
    std::lock_guard<std::mutex> lk(mu_);
    return {limit_, static_cast<int64_t>(cached_bytes_), static_cast<int64_t>(free_.size() + small_blocks_), hits_, misses_};
  }
  void set_limit(int64_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    limit_ = bytes < 0 ? 0 : bytes;
    evict_to(static_cast<size_t>(limit_));
  }
  void clear() {
    std::lock_guard<std::mutex> lk(mu_);
    evict_to(0);
  }

  static Pool& get() {
    static Pool* cache = new Pool();  // never destroyed: outputs may outlive static destructors
    return *cache;
  }

  static void release(Block* b) {
    Pool& c = get();
    std::unique_lock<std::mutex> lk(c.mu_);
    if (b->bytes > static_cast<size_t>(c.limit_)) {
      lk.unlock();
      destroy(b);
      return;
    }
    if (b->bytes < kLargeBytes) {  // small: kept while there is room, never at a large block's expense
      if (c.small_blocks_ >= kMaxSmallBlocks || c.cached_bytes_ + b->bytes > static_cast<size_t>(c.limit_)) {
        lk.unlock();
        destroy(b);
        return;
      }
      c.small_[b->bytes].push_back(b);
      ++c.small_blocks_;
      c.cached_bytes_ += b->bytes;
      return;
    }
    c.evict_to(static_cast<size_t>(c.limit_) - b->bytes);
    c.free_.push_back(b);  // the back is the most recently freed
    c.cached_bytes_ += b->bytes;
  }

 private:
  // The smallest cached large block of at least `bytes` and at most 8/7 of it, taken out of the
  // cache; mu_ held.
  Block* take(size_t bytes) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if ((*it)->bytes >= bytes && (*it)->bytes - bytes <= bytes / 7 && (best == free_.end() || (*it)->bytes < (*best)->bytes))
        best = it;
    if (best == free_.end()) return nullptr;
    Block* b = *best;
    cached_bytes_ -= b->bytes;
    free_.erase(best);
    return b;
  }
  // The most recently freed small block of exactly `bytes` (still warm in cache); mu_ held.
  Block* take_small(size_t bytes) {
    auto it = small_.find(bytes);
    if (it == small_.end() || it->second.empty()) return nullptr;
    Block* b = it->second.back();
    it->second.pop_back();
    --small_blocks_;
    cached_bytes_ -= b->bytes;
    return b;
  }
  void evict_to(size_t bytes) {  // large blocks, the least recently freed first, then small ones; mu_ held
    while (cached_bytes_ > bytes && !free_.empty()) {
      Block* b = free_.front();
      free_.pop_front();
      cached_bytes_ -= b->bytes;
      destroy(b);
    }
    for (auto it = small_.begin(); cached_bytes_ > bytes && it != small_.end(); ++it)
      while (cached_bytes_ > bytes && !it->second.empty()) {
        Block* b = it->second.back();
        it->second.pop_back();
        --small_blocks_;
        cached_bytes_ -= b->bytes;
        destroy(b);
      }
  }
  static void destroy(Block* b) {
    std::free(b->data);
    delete b;
  }

  std::mutex mu_;
  std::list<Block*> free_;                                  // large blocks, least recently freed first
  std::unordered_map<size_t, std::vector<Block*>> small_;  // small blocks by size (an entry per size seen)
  size_t small_blocks_ = 0, cached_bytes_ = 0;
  int64_t limit_ = 0, hits_ = 0, misses_ = 0;
};

}  // namespace

void* BlockPool::acquire(size_t n, PoolBlock** block) { return Pool::get().acquire(n, block); }
void BlockPool::release(PoolBlock* block) { Pool::release(reinterpret_cast<Block*>(block)); }
OutputCacheInfo BlockPool::info() { return Pool::get().info(); }
void BlockPool::set_limit(int64_t bytes) { Pool::get().set_limit(bytes); }
void BlockPool::clear() { Pool::get().clear(); }

}  // namespace opgym_torch
