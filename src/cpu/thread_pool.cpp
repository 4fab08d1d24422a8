// Persistent workers: a generation counter announces a job; a worker enters it only while it is
// still open, so the caller never waits for a worker that has not started.
#include "cpu/thread_pool.h"

#include <algorithm>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define EMBER_PAUSE() _mm_pause()
#else
#define EMBER_PAUSE() std::this_thread::yield()
#endif

namespace ember {

namespace {
constexpr int kSpinsBeforeSleep = 1 << 16;
constexpr int kSpinsBeforeYield = 1 << 10;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_.store(true);
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::drain() {
    for (;;) {
        const int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
        if (begin >= n_) return;
        (*fn_)(begin, std::min(n_, begin + grain_));
    }
}

void ThreadPool::worker_loop() {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (generation_.load(std::memory_order_acquire) == seen) {
            if (++spins < kSpinsBeforeSleep) {
                EMBER_PAUSE();
                continue;
            }
            std::unique_lock<std::mutex> lock(mutex_);
            sleepers_.fetch_add(1);
            wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
            sleepers_.fetch_sub(1);
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_.load()) return;
        entered_.fetch_add(1, std::memory_order_acq_rel);
        if (open_gen_.load(std::memory_order_acquire) == seen) drain();
        entered_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    if (n_threads_ == 1 || n <= grain) {
        fn(0, n);
        return;
    }
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    next_.store(0, std::memory_order_relaxed);
    {
        // Publishing under the mutex means a worker about to sleep cannot miss the wake-up.
        std::lock_guard<std::mutex> lock(mutex_);
        const uint64_t gen = generation_.load() + 1;
        open_gen_.store(gen, std::memory_order_release);
        generation_.store(gen, std::memory_order_release);
    }
    if (sleepers_.load() > 0) wake_.notify_all();
    drain();
    // Close the job; then wait only for workers already inside it (they finish their chunk).
    open_gen_.store(0, std::memory_order_release);
    for (int spins = 0; entered_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins < kSpinsBeforeYield) EMBER_PAUSE();
        else std::this_thread::yield();
    }
    fn_ = nullptr;
}

}  // namespace ember
