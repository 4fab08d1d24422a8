// The grammar worker: after a step samples a constrained sequence's token, threads of its own
// advance that sequence's matcher and compute its next token mask while the engine plans and runs
// the next forward step; the sampler waits for a mask only if it is not there yet.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ember/grammar.h"

namespace ember {

// One sequence's grammar state. It lives as long as its sequence (preempted, swapped out or
// recomputed alike: the tokens it has taken stay taken) and any advance still queued for it.
class GrammarSlot {
public:
    explicit GrammarSlot(std::unique_ptr<GrammarMatcher> m) : matcher_(std::move(m)) {}
    // The matcher once its last advance is done (its mask is then the next token's).
    const GrammarMatcher& wait();
    bool ready();

private:
    friend class GrammarWorker;
    std::unique_ptr<GrammarMatcher> matcher_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool busy_ = false;
};

class GrammarWorker {
public:
    explicit GrammarWorker(int n_threads);
    ~GrammarWorker();   // finishes the queued advances, then joins
    // Queues slot's advance by token (one at a time per slot: the engine waits for the last first).
    void advance(std::shared_ptr<GrammarSlot> slot, int32_t token);

private:
    void run();
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::pair<std::shared_ptr<GrammarSlot>, int32_t>> queue_;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

}  // namespace ember
