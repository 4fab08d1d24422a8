// A small persistent thread pool for the CPU backend. Workers spin briefly between jobs
// because decode issues hundreds of short parallel ops per token; after a while idle they sleep.
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
    // Runs fn(thread_index, n_threads) on every thread (the caller is index 0); returns when all did.
    void run(const std::function<void(int, int)>& fn);
    // Splits [0, n) into chunks of `grain` handed out dynamically; fn(begin, end).
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop(int index);

    int n_threads_;
    std::vector<std::thread> workers_;
    const std::function<void(int, int)>* job_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<int> sleepers_{0};
};

}  // namespace ember
