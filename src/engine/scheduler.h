// The scheduler's side of the engine: the waiting, running and swapped-out sequences over one
// KVCache, and the plan of each step under the token budget (decodes first, then chunks of
// prompts; the newest running sequence preempted when blocks run out: swapped out to the host
// tier when it has room, else freed to be recomputed later). A hybrid model's running sequences each
// hold a recurrent state slot: a cached prefix serves them only up to the longest prefix whose
// state the engine kept (StateSnapshots), and they are recomputed, never swapped, when preempted.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/sequence.h"
#include "engine/state_snapshots.h"
#include "kv/kv_cache.h"
#include "model/runner.h"

namespace ember {

// One sequence's part of a step: positions [start, start + len) of its tokens.
struct StepSeq {
    Sequence* seq;
    int32_t start, len;
    int32_t first_row;   // its first logits row in the step's output, -1 for none
    int32_t n_rows;      // rows of logits: the whole chunk (prompt logprobs), its last token, or none
    bool samples;        // the chunk ends the sequence's tokens: its last row gives the next token
};

struct StepPlan {
    std::vector<int32_t> tokens;
    BatchInfo batch;
    std::vector<RowRange> rows;
    std::vector<StepSeq> seqs;
};

class Scheduler {
public:
    // n_state_slots: recurrent state slots to hand out (0: the model has no recurrent layers);
    // snapshots: the kept states that cached prefixes of those models resume from (null: none).
    Scheduler(KVCache& cache, int32_t max_num_seqs, int32_t max_batched_tokens, bool prefix_caching,
              int32_t n_state_slots = 0, StateSnapshots* snapshots = nullptr);
    void add(std::unique_ptr<Sequence> s);
    // Takes the sequence out (waiting, running or swapped out), its blocks or host slots
    // released; null if unknown.
    std::unique_ptr<Sequence> remove(int64_t id);
    // The next step; empty (no seqs) when nothing can run.
    StepPlan plan();
    // After the step's forward: the chunks' KV committed to the cache.
    void commit(const StepPlan& step);
    size_t n_running() const { return running_.size(); }
    size_t n_waiting() const { return waiting_.size(); }
    size_t n_swapped() const { return swapped_.size(); }
    int64_t preemptions() const { return preemptions_; }   // swapped out or freed for recompute
    int64_t swaps_out() const { return swaps_out_; }
    int64_t swaps_in() const { return swaps_in_; }
    int64_t cached_prompt_tokens() const { return cached_prompt_tokens_; }
    bool idle() const { return running_.empty() && waiting_.empty() && swapped_.empty(); }
    int32_t free_state_slots() const { return (int32_t)free_slots_.size(); }
    // Every sequence, waiting, running and swapped out (to finish them all at shutdown).
    std::vector<int64_t> ids() const;

private:
    // Takes the newest running sequence not in `taken` off the device: swapped out when the host
    // tier has room, else freed and queued first for recompute. False when there is none.
    bool preempt(const std::vector<Sequence*>& taken);
    bool admit(Sequence& s, int32_t budget);   // maps its cached prefix and reserves its first chunk
    // Swaps the oldest swapped-out sequence back in with its next chunk reserved, if the pool has
    // room for it and a block of growth for every running sequence.
    bool resume(int32_t budget);

    void release_slot(Sequence& s);
    // The tokens of s's next chunk within budget: for a hybrid model, ending on a snapshot position.
    int32_t chunk_for(const Sequence& s, int32_t budget) const;

    KVCache& cache_;
    int32_t max_num_seqs_, max_batched_tokens_;
    bool prefix_caching_;
    bool recurrent_;
    std::vector<int32_t> free_slots_;
    StateSnapshots* snapshots_;
    std::deque<std::unique_ptr<Sequence>> waiting_;
    // In admission order; a swapped-in sequence goes back to its place by arrival.
    std::vector<std::unique_ptr<Sequence>> running_;
    std::deque<std::unique_ptr<Sequence>> swapped_;     // in arrival order
    int64_t preemptions_ = 0, swaps_out_ = 0, swaps_in_ = 0, cached_prompt_tokens_ = 0;
};

}  // namespace ember
