// Engine: the loop thread (plan a step, run it, sample, hand out), the request queue it drains
// and the output queue poll() empties. The loop holds the lock only to exchange requests and
// outputs, never during a forward step.
#include "ember/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "ember/status.h"
#include "backend/greedy_token.h"
#include "engine/grammar_worker.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "engine/state_snapshots.h"
#include "model/recurrent_state.h"
#include "model/runner.h"

namespace ember {

namespace {

// log softmax(row)[token], its rank (vLLM's: 1 + the tokens with a higher logit) and, for k > 0,
// the k most likely tokens with theirs.
float log_prob(const float* row, int32_t n_vocab, int32_t token, int32_t k, int32_t* rank,
               std::vector<std::pair<int32_t, float>>* top) {
    float mx = -std::numeric_limits<float>::infinity();
    int32_t higher = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        mx = std::max(mx, row[i]);
        higher += row[i] > row[token];
    }
    *rank = higher + 1;
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp((double)row[i] - mx);
    const double lse = mx + std::log(sum);
    if (top && k > 0) {
        std::vector<int32_t> ids(n_vocab);
        for (int32_t i = 0; i < n_vocab; ++i) ids[i] = i;
        const int32_t kk = std::min(k, n_vocab);
        std::partial_sort(ids.begin(), ids.begin() + kk, ids.end(),
                          [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        top->clear();
        for (int32_t i = 0; i < kk; ++i) top->push_back({ids[i], (float)(row[ids[i]] - lse)});
    }
    return (float)(row[token] - lse);
}

uint64_t kv_salt(GGMLType k, GGMLType v) { return (uint64_t(k) << 8 | uint64_t(v)) + 1; }

}  // namespace

struct EngineImpl {
    EngineParams params;
    Runner runner;
    KVCache cache;
    StateSnapshots snapshots;
    Scheduler sched;
    std::vector<int32_t> stop_ids_eog;   // the vocabulary's end-of-generation tokens
    int32_t n_vocab;

    mutable std::mutex mu;
    std::condition_variable work_cv, out_cv;
    std::vector<std::unique_ptr<Sequence>> incoming;
    std::unordered_set<int64_t> cancels;
    std::vector<EngineOutput> outbox;
    std::unordered_map<int64_t, size_t> outbox_index;   // request id -> its entry in outbox
    EngineStats stats;
    bool stopping = false;
    int64_t next_id = 1;
    uint64_t next_order = 0;
    // Made at the first constrained request, so unconstrained ones pay nothing; the worker is
    // destroyed (joined) before the model whose tokenizer its matchers read.
    std::mutex grammar_mu;
    std::unique_ptr<GrammarCompiler> grammars;
    std::unique_ptr<GrammarWorker> grammar_worker;
    std::thread loop;

    EngineImpl(std::shared_ptr<Model> m, const EngineParams& p, const RunnerParams& rp)
        : params(p), runner(std::move(m), rp),
          cache(rp.n_kv_blocks, rp.kv_block_size, kv_salt(rp.type_k, rp.type_v), p.enable_prefix_caching),
          snapshots(rp.n_state_slots > 0 ? p.state_snapshot_interval : 0, p.kv_block_size,
                    (size_t)p.state_snapshot_mb << 20),
          sched(cache, p.max_num_seqs, p.max_num_batched_tokens, p.enable_prefix_caching, rp.n_state_slots,
                &snapshots) {
        if (rp.n_host_tier_slots > 0)
            cache.enable_host_tier(
                rp.n_host_tier_slots, [this](const KVCache::BlockPairs& pairs) { runner.copy_blocks_to_host(pairs); },
                [this](const KVCache::BlockPairs& pairs) { runner.copy_blocks_from_host(pairs); });
        const Tokenizer& tok = runner.model().tokenizer();
        n_vocab = runner.model().hparams().n_vocab;
        for (int32_t i = 0; i < n_vocab; ++i)
            if (tok.is_eog(i)) stop_ids_eog.push_back(i);
    }

    void run();
    bool step();
    // Whether s may not draw some ids yet (min_tokens): its stop ids, and the end-of-generation
    // ids unless ignore_eos (as vLLM's min_tokens bans them).
    bool bans_tokens(const Sequence& s) const;
    // Whether every row the step samples takes plain greedy (no logprobs, nothing banned or
    // adjusted): the runner then returns each row's greedy id, not its logits.
    bool greedy_step(const StepPlan& plan) const;
    void sample(const StepPlan& plan, bool greedy);
    // The compiled grammar of a request (the compiler and worker made on first use).
    std::shared_ptr<GrammarSlot> grammar_slot(const RequestParams& r);
    void finish(Sequence& s, const char* reason, const std::string& error = "");
    void emit(Sequence& s);   // moves s.out into the outbox (lock held)
    void update_stats();      // lock held
};

void EngineImpl::emit(Sequence& s) {
    EngineOutput& o = s.out;
    if (o.token_ids.empty() && !o.finished && o.prompt_logprobs.empty()) return;
    o.request_id = s.id;
    auto it = outbox_index.find(s.id);
    if (it == outbox_index.end()) {
        outbox_index[s.id] = outbox.size();
        outbox.push_back(std::move(o));
    } else {
        // The consumer has not taken the last one yet: one output per request carries both.
        EngineOutput& prev = outbox[it->second];
        prev.token_ids.insert(prev.token_ids.end(), o.token_ids.begin(), o.token_ids.end());
        prev.logprobs.insert(prev.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
        prev.ranks.insert(prev.ranks.end(), o.ranks.begin(), o.ranks.end());
        prev.top_logprobs.insert(prev.top_logprobs.end(), o.top_logprobs.begin(), o.top_logprobs.end());
        if (!o.prompt_logprobs.empty()) {
            prev.prompt_logprobs = std::move(o.prompt_logprobs);
            prev.prompt_ranks = std::move(o.prompt_ranks);
            prev.prompt_top_logprobs = std::move(o.prompt_top_logprobs);
        }
        prev.finished = o.finished;
        prev.finish_reason = o.finish_reason;
        prev.stop_token_id = o.stop_token_id;
        prev.error = o.error;
    }
    const int32_t cached = s.out.num_cached_tokens;
    s.out = EngineOutput{};
    s.out.num_cached_tokens = cached;
}

void EngineImpl::finish(Sequence& s, const char* reason, const std::string& error) {
    s.out.finished = true;
    s.out.finish_reason = reason;
    s.out.error = error;
}

void EngineImpl::update_stats() {
    const BlockPoolStats ps = cache.pool().stats();
    stats.running = (int32_t)sched.n_running();
    stats.waiting = (int32_t)(sched.n_waiting() + sched.n_swapped() + incoming.size());
    stats.swapped = (int32_t)sched.n_swapped();
    stats.state_slots_total = runner.params().n_state_slots;
    stats.state_slots_free = sched.free_state_slots();
    stats.kv_blocks_total = ps.n_blocks;
    stats.kv_blocks_used = ps.n_used;
    stats.kv_blocks_cached = ps.n_cached;
    stats.prefix_cache_queries = ps.lookups;
    stats.prefix_cache_hits = ps.hits;
    stats.preemptions = sched.preemptions();
    stats.swaps_out = sched.swaps_out();
    stats.swaps_in = sched.swaps_in();
    if (const HostTier* host = cache.host_tier()) {
        const HostTierStats hs = host->stats();
        stats.host_blocks_total = hs.n_slots;
        stats.host_blocks_used = hs.n_used;
        stats.host_blocks_cached = hs.n_cached;
        stats.host_cache_hits = hs.hits;
    }
    stats.cached_prompt_tokens = sched.cached_prompt_tokens();
}

bool EngineImpl::bans_tokens(const Sequence& s) const {
    return s.n_generated < s.req.min_tokens &&
           (!s.req.stop_token_ids.empty() || (!s.req.ignore_eos && !stop_ids_eog.empty()));
}

bool EngineImpl::greedy_step(const StepPlan& plan) const {
    for (const StepSeq& ss : plan.seqs) {
        if (!ss.n_rows) continue;
        const Sequence& s = *ss.seq;
        if (!ss.samples || ss.n_rows != 1 || s.wants_prompt_logprobs() || s.req.logprobs >= 0 || bans_tokens(s) ||
            s.grammar || !s.sampler->plain_greedy(s.tokens))
            return false;
    }
    return true;
}

// Samples every sequence whose chunk ended its tokens, in parallel on the CPU backend's threads;
// gathers prompt logprobs. A greedy step takes the runner's ids.
void EngineImpl::sample(const StepPlan& plan, bool greedy) {
    if (greedy) {
        const std::vector<int32_t>& ids = runner.greedy_ids();
        for (const StepSeq& ss : plan.seqs) {
            Sequence& s = *ss.seq;
            if (!ss.samples || s.n_generated >= s.req.max_tokens) continue;
            const int32_t tok = ids[(size_t)ss.first_row];
            if (tok < 0) finish(s, "error", "sampling: no token can be drawn: every logit is -inf or NaN");
            else s.out.token_ids.push_back(tok);
        }
        return;
    }
    const float* logits = runner.logits();
    std::vector<const StepSeq*> work;
    for (const StepSeq& ss : plan.seqs)
        if (ss.n_rows) work.push_back(&ss);
    std::vector<std::string> errors(work.size());
    auto one = [&](size_t w) {
        const StepSeq& ss = *work[w];
        Sequence& s = *ss.seq;
        const float* rows = logits + (size_t)ss.first_row * n_vocab;
        if (s.wants_prompt_logprobs())
            for (int32_t r = 0; r < ss.n_rows; ++r) {
                const int32_t p = ss.start + ss.len - ss.n_rows + r;   // position of this row
                if (p + 1 < s.n_prompt && p == (int32_t)s.prompt_lp.size()) {
                    int32_t rank = 0;
                    std::vector<std::pair<int32_t, float>> top;
                    const int32_t k = s.req.prompt_top_logprobs;
                    s.prompt_lp.push_back(log_prob(rows + (size_t)r * n_vocab, n_vocab, s.tokens[p + 1], k, &rank,
                                                   k > 0 ? &top : nullptr));
                    s.prompt_rank.push_back(rank);
                    if (k > 0) s.prompt_top.push_back(std::move(top));
                }
            }
        if (!ss.samples || s.n_generated >= s.req.max_tokens) return;
        const float* row = rows + (size_t)(ss.n_rows - 1) * n_vocab;
        // Reused per thread: a decode step allocates nothing per sequence.
        thread_local std::vector<float> banned;
        const bool bans = bans_tokens(s);
        if (s.grammar && !bans && s.req.logprobs < 0 && s.sampler->plain_greedy(s.tokens)) {
            // Greedy under a grammar: the best allowed logit, read in place.
            const GrammarMatcher& m = s.grammar->wait();
            if (!m.error().empty()) {
                errors[w] = m.error();
                return;
            }
            const int32_t tok = greedy_token_masked(row, n_vocab, m.mask().data(), (int64_t)m.mask().size());
            if (tok < 0) errors[w] = "sampling: no token can be drawn: the grammar allows no token with a finite logit";
            else s.out.token_ids.push_back(tok);
            return;
        }
        if (bans || s.grammar) {
            banned.assign(row, row + n_vocab);
            if (s.grammar) {
                const GrammarMatcher& m = s.grammar->wait();
                if (!m.error().empty()) {
                    errors[w] = m.error();
                    return;
                }
                apply_token_mask(banned.data(), n_vocab, m.mask());
            }
            if (bans && !s.req.ignore_eos)
                for (int32_t id : stop_ids_eog) banned[id] = -std::numeric_limits<float>::infinity();
            if (bans)
                for (int32_t id : s.req.stop_token_ids) banned[id] = -std::numeric_limits<float>::infinity();
            row = banned.data();
        }
        try {
            const int32_t tok = s.sampler->sample(row, n_vocab, s.tokens);
            s.out.token_ids.push_back(tok);
            if (s.req.logprobs >= 0) {
                std::vector<std::pair<int32_t, float>> top;
                int32_t rank = 0;
                s.out.logprobs.push_back(log_prob(row, n_vocab, tok, s.req.logprobs, &rank, &top));
                s.out.ranks.push_back(rank);
                if (s.req.logprobs > 0) s.out.top_logprobs.push_back(std::move(top));
            }
        } catch (const std::exception& e) {
            errors[w] = e.what();
        }
    };
    if (HostParallelFor pf = runner.parallel_for(); pf && work.size() > 1)
        pf((int64_t)work.size(), 1, [&](int64_t b, int64_t e) {
            for (int64_t w = b; w < e; ++w) one((size_t)w);
        });
    else
        for (size_t w = 0; w < work.size(); ++w) one(w);
    for (size_t w = 0; w < work.size(); ++w)
        if (!errors[w].empty()) finish(*work[w]->seq, "error", errors[w]);
}

// One step: plan, forward, sample, then under the lock hand out outputs and retire finished
// sequences. Returns false when there was nothing to run.
bool EngineImpl::step() {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point t_plan = Clock::now();
    Clock::time_point t_forward = t_plan, t_sample = t_plan, t_output = t_plan;
    StepPlan plan = sched.plan();
    std::string failure;
    double grammar_wait = 0;
    try {
        // The plan's swaps and host-tier hits, copied before the forward writes any block; also
        // for an empty plan, whose host slots stay pinned until their copies have run.
        cache.flush_host_copies();
        if (plan.seqs.empty()) return false;
        plan.batch.batch_invariant = params.deterministic;
        plan.batch.fast_attention = !params.deterministic;
        t_forward = Clock::now();
        const bool greedy = greedy_step(plan);
        // A sequence starts from an empty recurrent state at its first token, or from the state kept
        // for the cached prefix it was admitted on.
        for (const StepSeq& ss : plan.seqs) {
            Sequence& s = *ss.seq;
            if (s.state_slot < 0) continue;
            if (s.resume_state) runner.restore_state(s.state_slot, *s.resume_state);
            else if (ss.start == 0) runner.clear_state(s.state_slot);
            s.resume_state.reset();
        }
        runner.clear_logits();
        runner.forward(plan.tokens.data(), plan.batch, plan.rows, greedy);
        sched.commit(plan);
        for (const StepSeq& ss : plan.seqs) {
            const int32_t end = ss.start + ss.len;
            if (ss.seq->state_slot >= 0 && snapshots.due(end))
                snapshots.put(snapshots.key(ss.seq->tokens.data(), end), runner.save_state(ss.seq->state_slot));
        }
        t_sample = Clock::now();
        // The masks the worker computed during the forward; time spent here is overlap missed.
        for (const StepSeq& ss : plan.seqs)
            if (ss.samples && ss.seq->grammar) ss.seq->grammar->wait();
        grammar_wait = std::chrono::duration<double>(Clock::now() - t_sample).count();
        sample(plan, greedy);
    } catch (const std::exception& e) {
        failure = e.what();
    }
    t_output = Clock::now();
    if (t_sample < t_forward) t_sample = t_output;   // the forward failed: its time counts as forward
    std::vector<int64_t> done;
    int64_t generated = 0;
    for (const StepSeq& ss : plan.seqs) {
        Sequence& s = *ss.seq;
        if (!failure.empty()) {
            finish(s, "error", failure);
        } else if (!s.out.finished && ss.samples) {
            if (s.wants_prompt_logprobs()) {
                s.out.prompt_logprobs = std::move(s.prompt_lp);
                s.out.prompt_ranks = std::move(s.prompt_rank);
                s.out.prompt_top_logprobs = std::move(s.prompt_top);
                s.prompt_lp_sent = true;
            }
            bool took = false;   // a token joined the sequence
            if (!s.out.token_ids.empty() && s.n_generated < s.req.max_tokens) {
                const int32_t tok = s.out.token_ids.back();
                // A grammar allows end of generation only where it is complete: there it ends.
                const bool eog = (!s.req.ignore_eos || s.grammar) &&
                                 std::binary_search(stop_ids_eog.begin(), stop_ids_eog.end(), tok);
                const bool stop_id = std::find(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), tok) !=
                                     s.req.stop_token_ids.end();
                ++generated;
                if (eog || stop_id) {
                    if (stop_id) s.out.stop_token_id = tok;
                    // The stop token ends the text and is not part of it.
                    s.out.token_ids.pop_back();
                    if (!s.out.logprobs.empty()) s.out.logprobs.pop_back();
                    if (!s.out.ranks.empty()) s.out.ranks.pop_back();
                    if (!s.out.top_logprobs.empty()) s.out.top_logprobs.pop_back();
                    finish(s, "stop");
                } else {
                    s.tokens.push_back(tok);
                    ++s.n_generated;
                    took = true;
                }
            }
            if (!s.out.finished && (s.n_generated >= s.req.max_tokens || (int32_t)s.tokens.size() >= params.n_ctx))
                finish(s, "length");
            // The next mask, computed while the next step's forward runs.
            if (took && !s.out.finished && s.grammar) grammar_worker->advance(s.grammar, s.tokens.back());
        }
        if (s.out.finished) done.push_back(s.id);
    }
    std::lock_guard<std::mutex> lk(mu);
    ++stats.steps;
    for (const StepSeq& ss : plan.seqs) {
        if (ss.start < ss.seq->n_prompt) stats.prompt_tokens += std::min(ss.len, ss.seq->n_prompt - ss.start);
        emit(*ss.seq);
    }
    // Last: removing a finished sequence frees it, and the step's entries point at it.
    for (int64_t id : done) sched.remove(id);
    stats.generation_tokens += generated;
    update_stats();
    auto seconds = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double>(b - a).count();
    };
    stats.seconds_schedule += seconds(t_plan, t_forward);
    stats.seconds_forward += seconds(t_forward, t_sample);
    stats.seconds_sample += seconds(t_sample, t_output);
    stats.seconds_grammar_wait += grammar_wait;
    stats.seconds_output += seconds(t_output, Clock::now());
    out_cv.notify_all();
    return true;
}

void EngineImpl::run() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(mu);
            work_cv.wait(lk, [&] { return stopping || !incoming.empty() || !cancels.empty() || !sched.idle(); });
            if (stopping) break;
            // The counts change here only when requests arrive or leave; a step updates its own.
            if (!incoming.empty() || !cancels.empty()) {
                for (auto& s : incoming) sched.add(std::move(s));
                incoming.clear();
                for (int64_t id : cancels)
                    if (std::unique_ptr<Sequence> s = sched.remove(id)) {
                        finish(*s, "abort");
                        emit(*s);
                    }
                cancels.clear();
                update_stats();
                out_cv.notify_all();
            }
        }
        step();
    }
    std::lock_guard<std::mutex> lk(mu);
    for (auto& s : incoming) sched.add(std::move(s));
    incoming.clear();
    for (int64_t id : sched.ids())
        if (std::unique_ptr<Sequence> s = sched.remove(id)) {
            finish(*s, "abort");
            emit(*s);
        }
    update_stats();
    out_cv.notify_all();
}

std::shared_ptr<GrammarSlot> EngineImpl::grammar_slot(const RequestParams& r) {
    GrammarCompiler* compiler;
    {
        std::lock_guard<std::mutex> lk(grammar_mu);
        if (!grammars) {
            grammars = std::make_unique<GrammarCompiler>(runner.model().tokenizer());
            const int hw = (int)std::thread::hardware_concurrency();
            grammar_worker = std::make_unique<GrammarWorker>(std::clamp(hw / 8, 1, 4));
        }
        compiler = grammars.get();
    }
    return std::make_shared<GrammarSlot>(compiler->compile(r.grammar_kind, r.grammar)->matcher());
}

Engine::Engine(std::shared_ptr<Model> model, const EngineParams& p) {
    if (p.n_ctx <= 0) fail("n_ctx must be positive, got ", p.n_ctx);
    if (p.max_num_seqs <= 0) fail("max_num_seqs must be positive, got ", p.max_num_seqs);
    if (p.max_num_batched_tokens <= 0) fail("max_num_batched_tokens must be positive, got ", p.max_num_batched_tokens);
    if (p.kv_block_size <= 0) fail("kv_block_size must be positive, got ", p.kv_block_size);
    if (p.kv_blocks < 0) fail("kv_blocks must be >= 0, got ", p.kv_blocks);
    if (p.state_snapshot_mb < 0) fail("state_snapshot_mb must be >= 0, got ", p.state_snapshot_mb);
    if (!(p.kv_mb >= 0) || !std::isfinite(p.kv_mb)) fail("kv_mb must be a finite number >= 0, got ", p.kv_mb);
    if (!(p.kv_host_mb >= 0) || !std::isfinite(p.kv_host_mb))
        fail("kv_host_mb must be a finite number >= 0 (0: no host tier), got ", p.kv_host_mb);
    const HParams& hp = model->hparams();
    const size_t block_bytes = kv_block_bytes_model(hp, p.kv_block_size, p.type_k, p.type_v);
    const int64_t per_seq = (p.n_ctx + p.kv_block_size - 1) / p.kv_block_size;
    const double mib = 1024.0 * 1024.0;
    int64_t n_blocks;
    if (p.kv_blocks > 0) n_blocks = p.kv_blocks;
    else if (p.kv_mb > 0) n_blocks = (int64_t)(p.kv_mb * mib / (double)block_bytes);
    else
        n_blocks = std::max<int64_t>(
            per_seq,
            std::min<int64_t>(per_seq * p.max_num_seqs, (int64_t)(EngineParams::kDefaultKvMiB * mib / block_bytes)));
    if (n_blocks < per_seq)
        fail("the KV pool (", n_blocks, " blocks of ", p.kv_block_size, " tokens, ", n_blocks * block_bytes / mib,
             " MiB) cannot hold one sequence of n_ctx ", p.n_ctx, " tokens, which needs ", per_seq, " blocks (",
             per_seq * block_bytes / mib, " MiB): raise kv_mb / kv_blocks or lower n_ctx");
    if (n_blocks > std::numeric_limits<int32_t>::max()) fail("the KV pool of ", n_blocks, " blocks is too large");
    const double host_blocks = std::floor(p.kv_host_mb * mib / (double)block_bytes);
    if (p.kv_host_mb > 0 && host_blocks < 1)
        fail("kv_host_mb ", p.kv_host_mb, " MiB holds no KV block, which takes ", block_bytes / mib,
             " MiB: raise kv_host_mb, or 0 for no host tier");
    if (host_blocks > std::numeric_limits<int32_t>::max())
        fail("kv_host_mb ", p.kv_host_mb, " MiB makes a host tier of ", host_blocks, " blocks, too many");
    RunnerParams rp;
    rp.n_batch = p.max_num_batched_tokens;
    rp.n_threads = p.n_threads;
    rp.n_kv_blocks = (int32_t)n_blocks;
    rp.n_ctx_seq = p.n_ctx;
    rp.n_host_tier_slots = (int32_t)host_blocks;
    rp.kv_block_size = p.kv_block_size;
    rp.type_k = p.type_k;
    rp.type_v = p.type_v;
    rp.offload_kqv = p.offload_kqv;
    rp.kv_gpu_cache_mb = p.kv_gpu_cache_mb;
    // A hybrid model's running sequences each hold a recurrent state slot.
    rp.n_state_slots = has_recurrent_layers(hp) ? p.max_num_seqs : 0;
    impl_ = std::make_unique<EngineImpl>(std::move(model), p, rp);
    impl_->update_stats();
    impl_->loop = std::thread([this] { impl_->run(); });
}

Engine::~Engine() { close(); }

void Engine::close() {
    EngineImpl& e = *impl_;
    {
        std::lock_guard<std::mutex> lk(e.mu);
        e.stopping = true;
    }
    e.work_cv.notify_all();
    if (e.loop.joinable()) e.loop.join();
}

int64_t Engine::add_request(const RequestParams& r) {
    EngineImpl& e = *impl_;
    const int32_t n = (int32_t)r.prompt.size();
    if (n == 0) fail("the prompt is empty: a request needs at least one token");
    for (int32_t i = 0; i < n; ++i)
        if (r.prompt[i] < 0 || r.prompt[i] >= e.n_vocab)
            fail("prompt token id ", r.prompt[i], " at index ", i, " is out of range [0, ", e.n_vocab, ")");
    if (r.max_tokens < 0) fail("max_tokens must be >= 0, got ", r.max_tokens);
    if (r.min_tokens < 0 || r.min_tokens > r.max_tokens)
        fail("min_tokens must be in [0, max_tokens = ", r.max_tokens, "], got ", r.min_tokens);
    if (n + (r.max_tokens > 0 ? 1 : 0) > e.params.n_ctx)
        fail("the prompt has ", n, " tokens; with room for a generated one that exceeds n_ctx ", e.params.n_ctx);
    if (r.logprobs < -1 || r.logprobs > RequestParams::kMaxLogprobs)
        fail("logprobs must be in [-1, ", RequestParams::kMaxLogprobs, "] (-1: none), got ", r.logprobs);
    if (r.prompt_top_logprobs < 0 || r.prompt_top_logprobs > RequestParams::kMaxLogprobs)
        fail("prompt_top_logprobs must be in [0, ", RequestParams::kMaxLogprobs, "], got ", r.prompt_top_logprobs);
    for (int32_t id : r.stop_token_ids)
        if (id < 0 || id >= e.n_vocab) fail("stop_token_ids: ", id, " is out of range [0, ", e.n_vocab, ")");
    // (the sampler knows no vocabulary until it samples: checked here, the request is refused whole)
    for (const auto& [id, bias] : r.sampling.logit_bias)
        if (id >= e.n_vocab) fail("logit_bias: token id ", id, " is out of range [0, ", e.n_vocab, ")");
    auto s = std::make_unique<Sequence>();
    s->sampler = std::make_unique<Sampler>(r.sampling);   // throws naming a bad sampling parameter
    if (!r.grammar_kind.empty()) s->grammar = e.grammar_slot(r);
    s->req = r;
    s->tokens = r.prompt;
    s->n_prompt = n;
    std::lock_guard<std::mutex> lk(e.mu);
    if (e.stopping) fail("the engine is closed");
    s->id = e.next_id++;
    s->order = e.next_order++;
    const int64_t id = s->id;
    e.incoming.push_back(std::move(s));
    e.work_cv.notify_all();
    return id;
}

void Engine::cancel(int64_t id) {
    EngineImpl& e = *impl_;
    {
        std::lock_guard<std::mutex> lk(e.mu);
        // A request still in the incoming queue is dropped there.
        for (auto it = e.incoming.begin(); it != e.incoming.end(); ++it)
            if ((*it)->id == id) {
                e.finish(**it, "abort");
                e.emit(**it);
                e.incoming.erase(it);
                e.out_cv.notify_all();
                return;
            }
        e.cancels.insert(id);
    }
    e.work_cv.notify_all();
}

std::vector<EngineOutput> Engine::poll(double timeout_s) {
    EngineImpl& e = *impl_;
    std::unique_lock<std::mutex> lk(e.mu);
    if (e.outbox.empty() && timeout_s > 0)
        e.out_cv.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return !e.outbox.empty(); });
    std::vector<EngineOutput> out;
    out.swap(e.outbox);
    e.outbox_index.clear();
    return out;
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lk(impl_->mu);
    return impl_->stats;
}

const EngineParams& Engine::params() const { return impl_->params; }
const Model& Engine::model() const { return impl_->runner.model(); }

}  // namespace ember
