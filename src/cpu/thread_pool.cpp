// Persistent worker threads: a generation counter announces a job, a pending counter says when
// every worker finished it.
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
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
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
        (*job_)(index, n_threads_);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_release);
    {
        // Publishing under the mutex means a worker about to sleep cannot miss the wake-up.
        std::lock_guard<std::mutex> lock(mutex_);
        generation_.fetch_add(1, std::memory_order_acq_rel);
    }
    if (sleepers_.load() > 0) wake_.notify_all();
    fn(0, n_threads_);
    while (pending_.load(std::memory_order_acquire) != 0) EMBER_PAUSE();
    job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    if (n_threads_ == 1 || n <= grain) {
        fn(0, n);
        return;
    }
    std::atomic<int64_t> next{0};
    run([&](int, int) {
        for (;;) {
            int64_t begin = next.fetch_add(grain, std::memory_order_relaxed);
            if (begin >= n) break;
            fn(begin, std::min(n, begin + grain));
        }
    });
}

}  // namespace ember
