// How the core runs row ranges in parallel. The core has its own thread pool (OPGYM_NUM_THREADS,
// default all cores); an embedding framework passes its own Executor instead (the torch binding
// runs on torch's intra-op pool), so the two never oversubscribe the machine.
#pragma once
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace opgym {

// A borrowed callable: no allocation, valid only during the call it is passed to.
template <typename Fn>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor)
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, Args... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(a)...);
        }) {}
  R operator()(Args... a) const { return call_(obj_, std::forward<Args>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

class Executor {
 public:
  virtual ~Executor() = default;
  // How many workers a parallel_for may use at most.
  virtual int max_threads() const = 0;
  // Calls fn(begin, end) on disjoint ranges covering [0, n), each at least `grain` long except
  // possibly the last; returns when all have finished. fn must not throw.
  virtual void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) = 0;
};

// The core's own pool, created on first use with OPGYM_NUM_THREADS threads (default: all cores).
Executor& default_executor();
// Runs everything on the calling thread.
Executor& serial_executor();
// A pool of its own with `threads` workers (the caller counts as one), e.g. for --threads options.
std::unique_ptr<Executor> make_thread_pool(int threads);

}  // namespace opgym
