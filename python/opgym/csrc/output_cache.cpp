// The per-torch library's outputs from the block pool (block_pool.hpp says why they are pooled).
#include "output_cache.hpp"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>

#include "block_pool.hpp"

namespace opgym_torch {
namespace {

class PoolAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    PoolBlock* b = nullptr;
    void* p = BlockPool::acquire(n, &b);
    TORCH_CHECK_WITH(OutOfMemoryError, p, "opgym: not enough memory for a ", n, "-byte output");
    return {p, b, &release, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  static void release(void* ctx) { BlockPool::release(static_cast<PoolBlock*>(ctx)); }
};

PoolAllocator& allocator() {
  static PoolAllocator* a = new PoolAllocator();  // never destroyed: outputs may outlive static destructors
  return *a;
}

}  // namespace

at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::detail::empty_generic(sizes, &allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                   c10::MemoryFormat::Contiguous);
}

}  // namespace opgym_torch
