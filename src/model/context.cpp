// Context: one sequence over a Runner (the forward) and a KVCache (its block table), fed in
// n_batch chunks, keeping logits or (embeddings) final-normed hidden rows. Llama drives it; the
// engine (src/engine) runs many sequences on the same parts. A hybrid model's sequence also has
// state slot 0 of the runner's recurrent state, which cannot be rewound: copies of it are kept every
// state_snapshot_interval tokens, and a cut resumes from the last copy at or before it.
#include <algorithm>
#include <deque>

#include "ember/status.h"
#include "kv/kv_cache.h"
#include "model/recurrent_state.h"
#include "model/runner.h"

namespace ember {

namespace {
constexpr int64_t kSeq = 0;
constexpr int32_t kSlot = 0;
} // namespace

struct ContextImpl {
    ContextParams params;
    Runner runner;
    KVCache cache;
    bool recurrent;
    // The recurrent state holds exactly the cache's tokens (false after a step that failed midway).
    bool state_ok = true;
    // The recurrent state after the first `pos` tokens of the cache, ascending by pos.
    struct Snapshot {
        int32_t pos;
        std::vector<float> state;
    };
    std::deque<Snapshot> snapshots;
    size_t max_snapshots = 0;
    int64_t n_evaluated = 0;

    ContextImpl(std::shared_ptr<Model> m, const ContextParams& p, const RunnerParams& rp)
        : params(p), runner(std::move(m), rp), cache(rp.n_kv_blocks, rp.kv_block_size, 0, false),
          recurrent(has_recurrent_layers(runner.model().hparams())) {
        cache.add(kSeq);
        if (recurrent && p.state_snapshot_interval > 0) {
            const size_t bytes = (size_t)runner.state_slot_floats() * sizeof(float);
            max_snapshots = ((size_t)p.state_snapshot_mb << 20) / std::max<size_t>(bytes, 1);
        }
    }

    bool snapshotting() const { return max_snapshots > 0; }

    // Tokens of the next chunk at position pos: at most n, and ending on a snapshot position.
    int32_t chunk(int32_t pos, int32_t n) const {
        if (!snapshotting()) return n;
        const int32_t every = params.state_snapshot_interval;
        return std::min(n, (pos / every + 1) * every - pos);
    }

    void forward(const int32_t* tokens, int32_t n, const std::vector<RowRange>& rows) {
        const int32_t n_past = cache.n_tokens(kSeq);
        if (!cache.reserve(kSeq, n)) fail("KV cache is full: all ", cache.pool().n_blocks(), " blocks are in use");
        const std::vector<int32_t>& table = cache.blocks(kSeq);
        BatchInfo batch;
        batch.n_tok = n;
        batch.n_seq = 1;
        batch.max_blocks = (int32_t)table.size();
        batch.block_table = table;
        batch.pos.resize(n);
        batch.seq.assign(n, 0);
        for (int32_t i = 0; i < n; ++i) batch.pos[i] = n_past + i;
        if (recurrent) {
            batch.state_slot = {kSlot};
            if (n_past == 0) runner.clear_state(kSlot);
            state_ok = false;
        }
        runner.forward(tokens, batch, rows);
        n_evaluated += n;
        cache.commit(kSeq, tokens, n);
        state_ok = true;
        const int32_t pos = n_past + n;
        if (snapshotting() && pos % params.state_snapshot_interval == 0) {
            if (snapshots.size() == max_snapshots) snapshots.pop_front();
            snapshots.push_back({pos, runner.save_state(kSlot)});
        }
    }

    // Evaluates the cache's tokens [from, to) (they are in it) again, as prompt chunks.
    void replay(const std::vector<int32_t>& tokens, int32_t from, int32_t to) {
        for (int32_t pos = from; pos < to;) {
            const int32_t len = chunk(pos, std::min(runner.params().n_batch, to - pos));
            forward(tokens.data() + pos, len, {});
            pos += len;
        }
    }

    // Makes the context hold its first n_past tokens again. A recurrent state has seen them all and
    // cannot be rewound: a hybrid model resumes from the last snapshot at or before n_past (else from
    // the start) and evaluates the tokens after it again.
    void truncate(int32_t n_past) {
        while (!snapshots.empty() && snapshots.back().pos > n_past) snapshots.pop_back();
        if (!recurrent || (n_past == cache.n_tokens(kSeq) && state_ok)) {
            cache.truncate(kSeq, n_past);
            return;
        }
        const std::vector<int32_t> keep(cache.tokens(kSeq).begin(), cache.tokens(kSeq).begin() + n_past);
        int32_t from = 0;
        if (!snapshots.empty()) {
            from = snapshots.back().pos;
            runner.restore_state(kSlot, snapshots.back().state);
        } else {
            runner.clear_state(kSlot);
        }
        cache.truncate(kSeq, from);
        state_ok = true;
        replay(keep, from, n_past);
    }
};

Context::Context(std::shared_ptr<Model> model, const ContextParams& params) {
    if (params.n_ctx <= 0) fail("n_ctx must be positive, got ", params.n_ctx);
    if (params.n_batch <= 0) fail("n_batch must be positive, got ", params.n_batch);
    if (params.kv_block_size <= 0) fail("kv_block_size must be positive, got ", params.kv_block_size);
    if (params.state_snapshot_interval < 0)
        fail("state_snapshot_interval must be >= 0 (0: no snapshots), got ", params.state_snapshot_interval);
    if (params.state_snapshot_mb < 0) fail("state_snapshot_mb must be >= 0, got ", params.state_snapshot_mb);
    RunnerParams rp;
    rp.n_batch = std::min(params.n_batch, params.n_ctx);
    rp.n_threads = params.n_threads;
    rp.n_kv_blocks = (params.n_ctx + params.kv_block_size - 1) / params.kv_block_size;
    rp.n_ctx_seq = params.n_ctx;
    rp.kv_block_size = params.kv_block_size;
    rp.type_k = params.type_k;
    rp.type_v = params.type_v;
    rp.offload_kqv = params.offload_kqv;
    rp.kv_gpu_cache_mb = params.kv_gpu_cache_mb;
    rp.embeddings = params.embeddings;
    rp.n_state_slots = 1;
    impl_ = std::make_unique<ContextImpl>(std::move(model), params, rp);
}

Context::~Context() = default;

void Context::eval(const int32_t* tokens, int32_t n, bool logits_all) {
    ContextImpl& c = *impl_;
    const int32_t n_vocab = c.runner.model().hparams().n_vocab;
    const int32_t n_past = c.cache.n_tokens(kSeq);
    if (n <= 0) fail("eval needs at least one token");
    if (n_past + n > c.params.n_ctx)
        fail("context overflow: ", n_past, " tokens in the cache + ", n, " new exceed n_ctx ", c.params.n_ctx);
    for (int32_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            fail("token id ", tokens[i], " at index ", i, " is out of range [0, ", n_vocab, ")");
    c.runner.clear_logits();
    const int32_t n_batch = c.runner.params().n_batch;
    for (int32_t start = 0; start < n;) {
        const int32_t len = c.chunk(n_past + start, std::min(n_batch, n - start));
        // Intermediate chunks of a prompt only fill the KV.
        std::vector<RowRange> rows;
        if (logits_all) rows.push_back({0, len});
        else if (start + len == n) rows.push_back({len - 1, 1});
        c.forward(tokens + start, len, rows);
        start += len;
    }
}

namespace {
// Row i (< 0: from the end) of the runner's output rows, named `what` in errors.
const float* output_row(const Runner& r, int32_t i, const char* what) {
    const int32_t n = r.n_logits();
    if (i < 0) i += n;
    if (i < 0 || i >= n) fail(what, " index out of range: ", i, " (have ", n, " rows)");
    return r.logits() + (size_t)i * r.row_width();
}
}  // namespace

const float* Context::logits(int32_t i) const {
    if (impl_->params.embeddings)
        fail("this context computes embeddings, not logits (it was created with embeddings=true)");
    return output_row(impl_->runner, i, "logits");
}

const float* Context::embeddings(int32_t i) const {
    if (!impl_->params.embeddings) fail("this context computes logits; create it with embeddings=true for embeddings");
    return output_row(impl_->runner, i, "embeddings");
}

int32_t Context::n_logits() const { return impl_->runner.n_logits(); }
int32_t Context::n_past() const { return impl_->cache.n_tokens(kSeq); }
int32_t Context::n_ctx() const { return impl_->params.n_ctx; }
int64_t Context::n_evaluated() const { return impl_->n_evaluated; }
const Model& Context::model() const { return impl_->runner.model(); }

void Context::truncate(int32_t n_past) {
    ContextImpl& c = *impl_;
    const int32_t have = c.cache.n_tokens(kSeq);
    if (n_past < 0 || n_past > have) fail("truncate: n_past ", n_past, " must be in [0, ", have, "]");
    c.truncate(n_past);
}

}  // namespace ember
