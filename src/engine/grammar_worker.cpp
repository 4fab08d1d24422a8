// The grammar worker's threads and each sequence's slot (grammar_worker.h).
#include "engine/grammar_worker.h"

namespace ember {

const GrammarMatcher& GrammarSlot::wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !busy_; });
    return *matcher_;
}

bool GrammarSlot::ready() {
    std::lock_guard<std::mutex> lk(mu_);
    return !busy_;
}

GrammarWorker::GrammarWorker(int n_threads) {
    for (int i = 0; i < n_threads; ++i) threads_.emplace_back([this] { run(); });
}

GrammarWorker::~GrammarWorker() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
}

void GrammarWorker::advance(std::shared_ptr<GrammarSlot> slot, int32_t token) {
    {
        std::lock_guard<std::mutex> lk(slot->mu_);
        slot->busy_ = true;
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        queue_.emplace_back(std::move(slot), token);
    }
    cv_.notify_one();
}

void GrammarWorker::run() {
    for (;;) {
        std::pair<std::shared_ptr<GrammarSlot>, int32_t> job;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;
            job = std::move(queue_.front());
            queue_.pop_front();
        }
        GrammarSlot& slot = *job.first;
        // A refused token leaves the matcher failed; the sampler reports its error.
        slot.matcher_->advance(job.second);
        {
            std::lock_guard<std::mutex> lk(slot.mu_);
            slot.busy_ = false;
        }
        slot.cv_.notify_all();
    }
}

}  // namespace ember
