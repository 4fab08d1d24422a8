// A small persistent thread pool for the CPU backend. Work is handed out in dynamic chunks, so
// the calling thread finishes a job alone when a worker is late (descheduled on a busy machine)
// instead of waiting for it. Workers spin briefly between jobs (decode issues hundreds of short
// parallel ops per token) and sleep once idle for a while.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ember {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);   // n_threads counts the calling thread
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }
    // Splits [0, n) into chunks of `grain` handed out dynamically; fn(begin, end) runs on the
    // caller and on whichever workers join in time. Returns when every chunk is done.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop();
    void drain();   // takes chunks of the current job until none are left

    int n_threads_;
    std::vector<std::thread> workers_;
    // The current job; valid while open_gen_ equals the generation a worker woke for.
    const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
    int64_t n_ = 0, grain_ = 1;
    std::atomic<int64_t> next_{0};
    std::atomic<uint64_t> generation_{0};
    std::atomic<uint64_t> open_gen_{0};   // 0: no job open
    std::atomic<int> entered_{0};         // workers inside the current job
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<int> sleepers_{0};
};

}  // namespace ember
