// Step planning: which tokens of which sequences one forward step computes, with the KV blocks
// they need reserved, and preemption when blocks run out (swap the newest out to the host tier
// and back in later, or free it and recompute it later).
#include "engine/scheduler.h"

#include <algorithm>
#include <cassert>

namespace ember {

Scheduler::Scheduler(KVCache& cache, int32_t max_num_seqs, int32_t max_batched_tokens, bool prefix_caching,
                     int32_t n_state_slots, StateSnapshots* snapshots)
    : cache_(cache), max_num_seqs_(max_num_seqs), max_batched_tokens_(max_batched_tokens),
      prefix_caching_(prefix_caching), recurrent_(n_state_slots > 0), snapshots_(snapshots) {
    for (int32_t slot = n_state_slots - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

int32_t Scheduler::chunk_for(const Sequence& s, int32_t budget) const {
    const int32_t chunk = std::min(s.need(), budget);
    if (!recurrent_ || !snapshots_ || !snapshots_->enabled()) return chunk;
    const int32_t every = snapshots_->every();
    return std::min(chunk, (s.n_computed / every + 1) * every - s.n_computed);
}

void Scheduler::release_slot(Sequence& s) {
    if (s.state_slot < 0) return;
    free_slots_.push_back(s.state_slot);
    s.state_slot = -1;
}

void Scheduler::add(std::unique_ptr<Sequence> s) { waiting_.push_back(std::move(s)); }

std::unique_ptr<Sequence> Scheduler::remove(int64_t id) {
    std::unique_ptr<Sequence> out;
    auto take = [&](auto& list) {
        for (auto it = list.begin(); it != list.end(); ++it)
            if ((*it)->id == id) {
                out = std::move(*it);
                list.erase(it);
                return true;
            }
        return false;
    };
    if (take(running_) || take(waiting_) || take(swapped_)) {
        cache_.remove(id);
        release_slot(*out);
    }
    return out;
}

std::vector<int64_t> Scheduler::ids() const {
    std::vector<int64_t> v;
    for (const auto& s : running_) v.push_back(s->id);
    for (const auto& s : waiting_) v.push_back(s->id);
    for (const auto& s : swapped_) v.push_back(s->id);
    return v;
}

bool Scheduler::preempt(const std::vector<Sequence*>& taken) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        Sequence* s = it->get();
        if (std::find(taken.begin(), taken.end(), s) != taken.end()) continue;
        // Either way its full blocks stay in the prefix cache, for others and for its own return.
        if (!recurrent_ && cache_.swap_out(s->id)) {
            auto at = std::find_if(swapped_.begin(), swapped_.end(),
                                   [&](const auto& p) { return p->order > s->order; });
            swapped_.insert(at, std::move(*it));
            ++swaps_out_;
        } else {
            cache_.remove(s->id);
            release_slot(*s);
            s->resume_state.reset();
            s->n_computed = 0;
            if (!s->prompt_lp_sent) {
                s->prompt_lp.clear();
                s->prompt_rank.clear();
                s->prompt_top.clear();
            }
            waiting_.push_front(std::move(*it));
        }
        running_.erase(std::next(it).base());
        ++preemptions_;
        return true;
    }
    return false;
}

bool Scheduler::admit(Sequence& s, int32_t budget) {
    if (recurrent_ && free_slots_.empty()) return false;
    cache_.add(s.id);
    // Prompt logprobs need the logits of every prompt token, so those prompts compute them all.
    if (prefix_caching_ && !s.wants_prompt_logprobs())
        s.n_computed = cache_.match_prefix(s.id, s.tokens.data(), (int32_t)s.tokens.size());
    if (recurrent_ && s.n_computed > 0) {
        // Only as far as a kept state: the recurrent layers resume from it.
        auto [pos, state] = snapshots_ ? snapshots_->longest(s.tokens.data(), s.n_computed)
                                       : std::pair<int32_t, StateSnapshots::State>{0, nullptr};
        cache_.truncate(s.id, pos);
        s.n_computed = pos;
        s.resume_state = std::move(state);
    }
    const int32_t chunk = chunk_for(s, budget);
    // Room left for every running sequence to grow by a block, so that admitting one does not
    // force a preemption at the next decode.
    const int32_t spare = (int32_t)running_.size();
    if (cache_.blocks_needed(s.id, chunk) + spare > cache_.pool().n_available() || !cache_.reserve(s.id, chunk)) {
        cache_.remove(s.id);
        s.n_computed = 0;
        s.resume_state.reset();
        return false;
    }
    if (recurrent_) {
        s.state_slot = free_slots_.back();
        free_slots_.pop_back();
    }
    if (!s.admitted) {
        s.out.num_cached_tokens = s.n_computed;
        cached_prompt_tokens_ += s.n_computed;
        s.admitted = true;
    }
    return true;
}

bool Scheduler::resume(int32_t budget) {
    Sequence& s = *swapped_.front();
    const int32_t chunk = std::min(s.need(), budget);
    const int32_t spare = (int32_t)running_.size();
    if (cache_.blocks_needed(s.id, chunk) + spare > cache_.pool().n_available()) return false;
    const bool ok = cache_.swap_in(s.id) && cache_.reserve(s.id, chunk);
    assert(ok);  // both counted in blocks_needed
    (void)ok;
    auto at = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p->order > s.order; });
    running_.insert(at, std::move(swapped_.front()));
    swapped_.pop_front();
    ++swaps_in_;
    return true;
}

StepPlan Scheduler::plan() {
    StepPlan step;
    const int64_t preemptions_before = preemptions_;
    std::vector<Sequence*> taken;
    std::vector<int32_t> chunks;
    int32_t budget = max_batched_tokens_;
    auto is_running = [&](const Sequence* s) {
        return std::any_of(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == s; });
    };
    // Decodes (one token) first, then the running prompts' next chunks, oldest first.
    for (int pass = 0; pass < 2; ++pass) {
        std::vector<Sequence*> order;
        for (const auto& p : running_) order.push_back(p.get());
        for (Sequence* s : order) {
            if (budget == 0) break;
            if (!is_running(s) || (s->need() == 1) != (pass == 0)) continue;
            const int32_t chunk = chunk_for(*s, budget);
            // The newest sequence not yet in this step goes first, possibly s itself.
            bool reserved;
            while (!(reserved = cache_.reserve(s->id, chunk)) && preempt(taken) && is_running(s)) {}
            if (!reserved) continue;
            taken.push_back(s);
            chunks.push_back(chunk);
            budget -= chunk;
        }
    }
    // Not in a step that had to preempt: the pool is short, and a sequence swapped in now would
    // be the next one out.
    const bool preempted = preemptions_ != preemptions_before;
    while (!preempted && !swapped_.empty() && budget > 0 && (int32_t)running_.size() < max_num_seqs_) {
        Sequence& s = *swapped_.front();
        if (!resume(budget)) break;
        const int32_t chunk = std::min(s.need(), budget);
        taken.push_back(&s);
        chunks.push_back(chunk);
        budget -= chunk;
    }
    // Swapped-out sequences come back before new requests start.
    while (swapped_.empty() && !waiting_.empty() && budget > 0 && (int32_t)running_.size() < max_num_seqs_) {
        Sequence& s = *waiting_.front();
        if (!admit(s, budget)) break;
        const int32_t chunk = chunk_for(s, budget);
        running_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        taken.push_back(&s);
        chunks.push_back(chunk);
        budget -= chunk;
    }
    if (taken.empty()) return step;

    BatchInfo& b = step.batch;
    b.n_seq = (int32_t)taken.size();
    for (Sequence* s : taken) b.max_blocks = std::max(b.max_blocks, (int32_t)cache_.blocks(s->id).size());
    b.block_table.assign((size_t)b.n_seq * b.max_blocks, 0);
    int32_t n_rows = 0;
    for (size_t i = 0; i < taken.size(); ++i) {
        Sequence* s = taken[i];
        const std::vector<int32_t>& blocks = cache_.blocks(s->id);
        std::copy(blocks.begin(), blocks.end(), b.block_table.begin() + (int64_t)i * b.max_blocks);
        StepSeq ss{s, s->n_computed, chunks[i], -1, 0, s->n_computed + chunks[i] == (int32_t)s->tokens.size()};
        const int32_t row0 = (int32_t)step.tokens.size();
        if (s->wants_prompt_logprobs()) ss.n_rows = ss.len;
        else if (ss.samples) ss.n_rows = 1;
        if (ss.n_rows) {
            ss.first_row = n_rows;
            const RowRange rr{row0 + ss.len - ss.n_rows, ss.n_rows};
            // Adjacent ranges merge: a decode step's rows are one range.
            if (!step.rows.empty() && step.rows.back().first + step.rows.back().count == rr.first)
                step.rows.back().count += rr.count;
            else step.rows.push_back(rr);
            n_rows += ss.n_rows;
        }
        for (int32_t j = 0; j < ss.len; ++j) {
            step.tokens.push_back(s->tokens[ss.start + j]);
            b.pos.push_back(ss.start + j);
            b.seq.push_back((int32_t)i);
        }
        step.seqs.push_back(ss);
        if (recurrent_) b.state_slot.push_back(s->state_slot);
    }
    b.n_tok = (int32_t)step.tokens.size();
    return step;
}

void Scheduler::commit(const StepPlan& step) {
    for (const StepSeq& ss : step.seqs) {
        cache_.commit(ss.seq->id, ss.seq->tokens.data() + ss.start, ss.len);
        ss.seq->n_computed += ss.len;
    }
}

}  // namespace ember
