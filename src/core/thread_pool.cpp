// The core's default executor: a fixed pool of workers that claim tasks from an atomic counter.
// The caller works too, so a pool of N threads keeps N-1 workers. A call that finds the pool busy
// (another thread is using it) runs on its own thread instead of queueing: no deadlock, no
// oversubscription. No allocation per call.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "opgym/error.hpp"
#include "opgym/parallel.hpp"

namespace opgym {
namespace {

int threads_from_env() {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  const char* env = std::getenv("OPGYM_NUM_THREADS");
  if (!env || !*env) return hw;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1 || n > 1024)
    throw Error("OPGYM_NUM_THREADS", std::string("OPGYM_NUM_THREADS='") + env + "' must be an integer from 1 to 1024");
  return static_cast<int>(n);
}

class SerialExecutor final : public Executor {
 public:
  int max_threads() const override { return 1; }
  void parallel_for(int64_t n, int64_t, FunctionRef<void(int64_t, int64_t)> fn) override {
    if (n > 0) fn(0, n);
  }
};

// Workers spin for kSpin after a job before they sleep: waking a sleeping thread costs 60-100 us on
// a virtual machine whose idle vCPU halts (measured here), which is more than a whole prefill-sized
// call; back-to-back calls (a model's layers) find the workers still spinning.
class ThreadPool final : public Executor {
 public:
  explicit ThreadPool(int threads) : threads_(threads) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~ThreadPool() override {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int max_threads() const override { return threads_; }

  void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) override {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    std::unique_lock<std::mutex> busy(call_, std::try_to_lock);
    if (threads_ == 1 || n <= grain || !busy.owns_lock()) {
      fn(0, n);
      return;
    }
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1);  // seq_cst: pairs with the sleepers_ check below (no lost wake-up)
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lk(m_);
      cv_.notify_all();
    }
    run_tasks();
    while (pending_.load(std::memory_order_acquire) != 0) pause();
  }

 private:
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }
  void run_tasks() {
    for (;;) {
      const int64_t b = next_.fetch_add(grain_, std::memory_order_relaxed);
      if (b >= n_) return;
      (*fn_)(b, std::min(n_, b + grain_));
    }
  }
  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = generation_.load(std::memory_order_acquire);
      const auto start = std::chrono::steady_clock::now();
      for (int spins = 0; g == seen && !stop_.load(std::memory_order_relaxed); ++spins) {
        if ((spins & 255) == 255 && std::chrono::steady_clock::now() - start > kSpin) break;
        pause();
        g = generation_.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(m_);
        sleepers_.fetch_add(1);  // seq_cst, then re-check generation_ in the predicate
        cv_.wait(lk, [&] { return stop_.load() || generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        g = generation_.load(std::memory_order_acquire);
      }
      if (stop_.load()) return;
      seen = g;
      run_tasks();
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  static constexpr std::chrono::microseconds kSpin{200};
  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex call_;  // one parallel_for at a time
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0}, sleepers_{0};
  const FunctionRef<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace

Executor& default_executor() {
  static ThreadPool pool(threads_from_env());
  return pool;
}

std::unique_ptr<Executor> make_thread_pool(int threads) {
  if (threads < 1) throw Error("threads", "threads must be >= 1, got " + std::to_string(threads));
  return std::make_unique<ThreadPool>(threads);
}

Executor& serial_executor() {
  static SerialExecutor serial;
  return serial;
}

}  // namespace opgym
