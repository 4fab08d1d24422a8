// Runner: one forward step. Embedding rows (host) -> each block's forward (its architecture's, on
// the device the placement plan gives it; the hidden state crosses a device boundary only where
// placement changes) -> final norm + output head over the rows asked for -> logits (host; for
// embeddings the head stops after the final norm and the normed hidden rows come back). Large
// one-sequence batches run CPU blocks on the GPU too, on streamed weights (streamed_weights.h).
// With offload_kqv=False the GPU blocks run on KVInHostMemory (kv_in_host_memory.h); the engine's
// host tier keeps its slots in HostTierMemory (host_tier_memory.h).
#include "model/runner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "backend/kv_layout.h"
#include "backend/registry.h"
#include "ember/status.h"
#include "model/host_tier_memory.h"
#include "model/imatrix_collector.h"
#include "model/kv_in_host_memory.h"
#include "model/model_impl.h"
#include "model/recurrent_state.h"
#include "model/remote_experts.h"
#include "model/streamed_weights.h"

namespace ember {

namespace {

// Activation buffers of one backend, each [n_batch][width] floats: the hidden state x, the
// fused ops' buffers, and the two block outputs (out_a, out_b).
struct Scratch {
    Backend* be = nullptr;
    float *x = nullptr, *out_a = nullptr, *out_b = nullptr, *logits = nullptr;
    int32_t* ids = nullptr;   // [logits_rows] greedy ids
    // Per-layer embeddings: the step's input embeddings [n_batch][n_embd] and every layer's rows of
    // per_layer_token_embd, layer-major [n_layer][n_tok][n_embd_per_layer]; null without them.
    float *embd = nullptr, *per_layer = nullptr;
    BlockBuffers buf{};
    int32_t logits_rows = 0;
};

// Logits rows [n][n_vocab] in host memory from the head's backend (CUDA: pinned, so the copy
// lands there directly, with no bounce buffer and no zero-filling resize).
class HostLogits {
public:
    HostLogits() = default;
    HostLogits(const HostLogits&) = delete;
    HostLogits& operator=(const HostLogits&) = delete;
    ~HostLogits() { release(); }
    void clear() { size_ = 0; }
    const float* data() const { return p_; }
    // Room for n more floats after the current ones (kept), from be's host memory.
    float* append(Backend& be, size_t n) {
        if (be_ != &be || size_ + n > cap_) {
            const size_t cap = std::max(size_ + n, 2 * cap_);
            float* p = static_cast<float*>(be.alloc_host(cap * sizeof(float)));
            if (size_) std::memcpy(p, p_, size_ * sizeof(float));
            release();
            be_ = &be, p_ = p, cap_ = cap;
        }
        size_ += n;
        return p_ + size_ - n;
    }

private:
    void release() {
        if (p_) be_->free_host(p_);
        p_ = nullptr;
        cap_ = 0;
    }
    Backend* be_ = nullptr;
    float* p_ = nullptr;
    size_t cap_ = 0, size_ = 0;
};

// One copy of n consecutive blocks, from ids src.. to ids dst...
struct CopyRun {
    int32_t src, dst, n;
};

// The (from, to) pairs as runs of ids consecutive on both sides, as if copied in order: when
// several pairs write the same `to`, only the last one's copy is kept.
std::vector<CopyRun> copy_runs(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    std::unordered_map<int32_t, size_t> last;
    for (size_t i = 0; i < pairs.size(); ++i) last[pairs[i].second] = i;
    std::vector<std::pair<int32_t, int32_t>> live;
    for (size_t i = 0; i < pairs.size(); ++i)
        if (last[pairs[i].second] == i) live.push_back(pairs[i]);
    std::sort(live.begin(), live.end());
    std::vector<CopyRun> runs;
    for (auto [from, to] : live) {
        if (!runs.empty() && runs.back().src + runs.back().n == from && runs.back().dst + runs.back().n == to)
            ++runs.back().n;
        else runs.push_back({from, to, 1});
    }
    return runs;
}

uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

}  // namespace

size_t kv_block_bytes_model(const HParams& hp, int32_t block_size, GGMLType type_k, GGMLType type_v) {
    size_t bytes = 0;
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        if (is_recurrent_layer(hp, l)) continue;
        const int64_t width = hp.kv_width(l);
        bytes += kv_block_bytes(type_k, block_size, width) +
                 (hp.kv_values_are_keys ? 0 : kv_block_bytes(type_v, block_size, width));
    }
    return bytes;
}

struct RunnerImpl {
    std::shared_ptr<Model> model;
    RunnerParams params;
    std::unique_ptr<Backend> cpu;
    std::vector<BlockWeights> blocks;   // per block, on its device (the plan's)
    HeadWeights head;
    std::map<Backend*, Scratch> scratch;
    std::vector<std::pair<Backend*, void*>> owned;   // every allocation, freed at the end
    std::vector<std::pair<Backend*, void*>> owned_host;   // every alloc_host allocation
    // [n_layer] experts that run apart from their block (be null where they run with it).
    std::vector<RemoteExperts> remote;
    float *remote_x = nullptr, *remote_out = nullptr;   // the crossings' host buffers, shared by the blocks
    // Null: the remote experts run on the CPU for every batch. Destroyed before `model`, whose GPU
    // backend it uses.
    std::unique_ptr<ExpertStream> expert_stream;
    std::vector<KVLayer> kv;
    // Null: CPU blocks always run on the CPU. Destroyed before `cpu` (whose pool it uses) and
    // `model` (whose GPU backend it uses).
    std::unique_ptr<StreamedWeights> stream;
    // offload_kqv=False: the GPU blocks run on this wrapper of the GPU backend, their KV in host
    // memory it owns. Null otherwise. After `cpu` and `model`, whose backends it uses.
    std::unique_ptr<KVInHostMemory> kv_in_host;
    HostLogits logits;   // [n_logits][row_width]; declared after `cpu` and `model`, whose host memory it holds
    HostTierMemory host_tier;   // the host tier's slots; after `cpu` and `model` too
    RecurrentState state;       // recurrent layers' state slots; after `cpu` and `model` too
    int32_t n_logits = 0;
    std::vector<int32_t> greedy_ids;
    std::vector<float> embd;   // [n_batch][n_embd] host staging for the embedding rows
    std::vector<float> per_layer;   // [n_layer][n_tok][n_embd_per_layer] host staging (per-layer embeddings)

    RunnerImpl(std::shared_ptr<Model> m, const RunnerParams& p) : model(std::move(m)), params(p) {}
    ~RunnerImpl() {
        for (auto& [be, ptr] : owned) be->free(ptr);
        for (auto& [be, ptr] : owned_host) be->free_host(ptr);
    }

    template <class T = float>
    T* alloc_array(Backend& be, int64_t n) {
        void* p = be.alloc((size_t)n * sizeof(T));
        owned.emplace_back(&be, p);
        return static_cast<T*>(p);
    }
    float* alloc_floats(Backend& be, int64_t n) { return alloc_array<float>(be, n); }

    Scratch& scratch_for(Backend& be) {
        Scratch& s = scratch[&be];
        if (s.be) return s;
        const HParams& hp = model->hparams();
        const int64_t B = params.n_batch;
        int64_t QW = 0, KW = 0;   // the widest layer's
        for (int32_t l = 0; l < hp.n_layer; ++l) {
            QW = std::max(QW, (int64_t)hp.n_head * hp.layer_head_dim(l));
            KW = std::max(KW, (int64_t)hp.layer_n_head_kv(l) * hp.layer_head_dim(l));
        }
        s.be = &be;
        s.x = alloc_floats(be, B * hp.n_embd);
        s.out_a = alloc_floats(be, B * hp.n_embd);
        s.out_b = alloc_floats(be, B * hp.n_embd);
        s.buf.xn = alloc_floats(be, B * hp.n_embd);
        s.buf.q = alloc_floats(be, B * QW);
        s.buf.k = alloc_floats(be, B * KW);
        s.buf.v = alloc_floats(be, B * KW);
        s.buf.att = alloc_floats(be, B * QW);
        // Blocks with per-layer embeddings work on their layer's input in gate and up.
        const int64_t F = std::max({hp.n_ff, hp.n_ff_exp, hp.n_embd_per_layer});
        s.buf.gate = alloc_floats(be, B * F);
        s.buf.up = alloc_floats(be, B * F);
        if (hp.n_embd_per_layer > 0) {
            s.embd = alloc_floats(be, B * hp.n_embd);
            s.per_layer = alloc_floats(be, B * hp.n_layer * hp.n_embd_per_layer);
        }
        if (hp.n_expert > 0)
            s.buf.moe = alloc_floats(be, moe_scratch_floats(B, hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used));
        if (const int64_t rec = model->impl().arch->recurrent_scratch_floats(hp); rec > 0)
            s.buf.recurrent = alloc_floats(be, B * rec);
        return s;
    }

    void forward(const int32_t* tokens, const BatchInfo& batch, const std::vector<RowRange>& rows, bool greedy);
    // Every layer's K and V bytes of the runs' blocks, between the pool and host_tier.
    void copy_host(const std::vector<std::pair<int32_t, int32_t>>& pairs, bool to_host);
    int32_t row_width() const { return params.embeddings ? model->hparams().n_embd : model->hparams().n_vocab; }
};

Runner::Runner(std::shared_ptr<Model> model, const RunnerParams& params) {
    if (params.n_batch <= 0) fail("n_batch must be positive, got ", params.n_batch);
    if (params.kv_block_size <= 0) fail("kv_block_size must be positive, got ", params.kv_block_size);
    if (params.n_kv_blocks <= 0) fail("the KV cache needs at least one block, got ", params.n_kv_blocks);
    if (params.n_host_tier_slots < 0) fail("n_host_tier_slots must be >= 0, got ", params.n_host_tier_slots);
    if (params.n_threads < 0) fail("n_threads must be >= 0, got ", params.n_threads);
    if (params.kv_gpu_cache_mb < 0) fail("kv_gpu_cache_mb must be >= 0, got ", params.kv_gpu_cache_mb);
    ModelImpl& m = model->impl();
    if (m.arch->encoder())
        fail(m.file->path(), ": ", m.hp.arch, " is an encoder (bidirectional attention, no KV cache): run it with ",
             "Encoder (ember.Encoder), not a Context or the engine");
    for (int32_t l = 0; l < m.hp.n_layer; ++l) check_kv_type(params.type_k, m.hp.layer_head_dim(l), "type_k");
    if (params.n_state_slots < 0) fail("n_state_slots must be >= 0, got ", params.n_state_slots);
    for (int32_t l = 0; l < m.hp.n_layer; ++l) check_kv_type(params.type_v, m.hp.layer_head_dim(l), "type_v");
    if (m.hp.kv_values_are_keys && params.type_v != params.type_k)
        fail(m.file->path(), ": ", m.hp.arch, "'s latent attention reads its values from the key cache: type_v (",
             type_traits(params.type_v).name, ") must be type_k (", type_traits(params.type_k).name, ")");
    impl_ = std::make_unique<RunnerImpl>(std::move(model), params);
    RunnerImpl& r = *impl_;
    BackendOptions opts;
    opts.n_threads = params.n_threads > 0 ? params.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    r.cpu = make_backend("cpu", opts);
    if (auto imatrix = imatrix_collector()) {
        if (m.any_gpu()) fail("ember-imatrix collects on the CPU only: load the model with n_gpu_layers=0");
        r.cpu = record_imatrix(std::move(r.cpu), imatrix);
    }
    const HParams& hp = m.hp;
    r.blocks.resize(hp.n_layer);
    for (int32_t l = 0; l < hp.n_layer; ++l)
        r.blocks[l] = m.plan.block[l] == Device::gpu ? m.gpu_blocks[l] : prepare_block(*r.cpu, m.blocks[l]);
    r.head = m.plan.head == Device::gpu ? m.gpu_head : prepare_head(*r.cpu, *m.output, *m.output_norm);
    r.remote.resize(hp.n_layer);
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        if (!m.plan.experts_apart(l)) continue;
        // The plan sets experts apart only on the CPU, for GPU blocks: the hidden state crosses
        // through pinned host memory of the GPU backend.
        RemoteExperts& e = r.remote[l];
        e.be = r.cpu.get();
        e.w = prepare_block_vectors(*r.cpu, m.blocks[l]);
        for (int k = 0; k < kRoles; ++k)
            if (m.moe_role[k] && m.blocks[l].matrix(k)) e.w.mat[k] = r.cpu->prepare_weight(*m.blocks[l].t[k]);
        e.buf = &r.scratch_for(*r.cpu).buf;
        if (!r.remote_x) {
            const size_t bytes = (size_t)params.n_batch * hp.n_embd * sizeof(float);
            r.remote_x = static_cast<float*>(m.gpu->alloc_host(bytes));
            r.owned_host.emplace_back(m.gpu.get(), r.remote_x);
            r.remote_out = static_cast<float*>(m.gpu->alloc_host(bytes));
            r.owned_host.emplace_back(m.gpu.get(), r.remote_out);
        }
        e.x = r.remote_x, e.out = r.remote_out;
    }
    KVLayer geometry;
    geometry.k_type = params.type_k;
    geometry.v_type = params.type_v;
    geometry.n_blocks = params.n_kv_blocks;
    geometry.block_size = params.kv_block_size;
    geometry.n_head_kv = hp.n_head_kv;
    geometry.head_dim = hp.head_dim;
    // The staging of streamed blocks and the KV in host memory hold one geometry for every layer.
    bool uniform_kv = true;
    for (int32_t l = 0; l < hp.n_layer; ++l)
        uniform_kv = uniform_kv && hp.kv_width(l) == (int64_t)hp.n_head_kv * hp.head_dim;
    // EMBER_STREAM=0: CPU blocks stay on the CPU for every batch (diagnosis, comparisons). Read from
    // the snapshot the context's CPU backend was made with. Models whose layers differ in KV
    // geometry or share KV keep their CPU blocks on the CPU.
    if (m.plan.any_gpu() && m.plan.any_cpu() && uniform_kv && opts.switches.on("EMBER_STREAM"))
        r.stream = StreamedWeights::open(m, r.blocks, *r.cpu, geometry);
    if (!params.offload_kqv && m.any_gpu()) {
        if (!uniform_kv)
            fail(m.file->path(), ": offload_kqv=False needs every layer to keep KV of one size; this ", hp.arch,
                 " model's layers differ in KV heads or head size, or share KV");
        const int32_t n_gpu_layers = (int32_t)std::count(m.plan.block.begin(), m.plan.block.end(), Device::gpu);
        r.kv_in_host = std::make_unique<KVInHostMemory>(*m.gpu, geometry, n_gpu_layers,
                                                        (size_t)params.kv_gpu_cache_mb << 20);
        for (int32_t l = 0; l < hp.n_layer; ++l)
            if (m.plan.block[l] == Device::gpu) r.blocks[l].backend = r.kv_in_host.get();
        if (m.plan.head == Device::gpu) r.head.backend = r.kv_in_host.get();
    }
    r.kv.assign(hp.n_layer, geometry);
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        KVLayer& kv = r.kv[l];
        kv.n_head_kv = hp.layer_n_head_kv(l);
        kv.head_dim = hp.layer_head_dim(l);
        Backend& be = *r.blocks[l].backend;
        if (is_recurrent_layer(hp, l)) continue;   // its state is in r.state
        // A layer reading another's KV attends over that layer's storage (forward passes it).
        const int64_t width = hp.kv_width(l);
        if (width == 0) continue;
        if (&be == r.kv_in_host.get()) {
            r.kv_in_host->alloc_layer(kv);
            continue;
        }
        for (auto [p, type] : {std::pair{&kv.k, kv.k_type}, std::pair{&kv.v, kv.v_type}}) {
            if (p == &kv.v && hp.kv_values_are_keys) {
                kv.v = kv.k;
                continue;
            }
            const size_t bytes = (size_t)params.n_kv_blocks * kv_block_bytes(type, params.kv_block_size, width);
            // A streamed block's KV (a CPU layer's) is pinned, so its copies run asynchronously at full speed.
            *p = be.is_host() && r.stream ? r.stream->alloc_host(bytes) : nullptr;
            if (!*p) {
                *p = be.alloc(bytes);
                r.owned.emplace_back(&be, *p);
            }
        }
    }
    if (params.n_host_tier_slots > 0) {
        std::vector<Backend*> be;
        std::vector<std::pair<size_t, size_t>> bytes;
        for (int32_t l = 0; l < hp.n_layer; ++l) {
            be.push_back(r.blocks[l].backend);
            bytes.emplace_back(kv_block_bytes(params.type_k, params.kv_block_size, hp.kv_width(l)),
                               kv_block_bytes(params.type_v, params.kv_block_size, hp.kv_width(l)));
        }
        r.host_tier.allocate(be, bytes, params.n_host_tier_slots);
    }
    std::vector<Backend*> layer_be;
    for (const BlockWeights& b : r.blocks) layer_be.push_back(b.backend);
    r.state.allocate(hp, layer_be, has_recurrent_layers(hp) ? params.n_state_slots : 0);
    r.embd.resize((size_t)params.n_batch * hp.n_embd);
    r.per_layer.resize((size_t)params.n_batch * hp.n_layer * hp.n_embd_per_layer);
    // After the KV: the staging is what gives way when the GPU is short.
    if (m.plan.any_experts_apart() && opts.switches.on("EMBER_STREAM"))
        r.expert_stream = ExpertStream::open(*m.gpu, r.remote, r.cpu->host_parallel_for(), m.params.verbose);
}

Runner::~Runner() = default;

void RunnerImpl::forward(const int32_t* tokens, const BatchInfo& batch, const std::vector<RowRange>& rows,
                         bool greedy) {
    ModelImpl& m = model->impl();
    const HParams& hp = m.hp;
    const int64_t E = hp.n_embd;
    const int32_t n = batch.n_tok;

    // Embedding rows stay in host memory (token_embd may be the largest tensor).
    const TypeTraits& et = type_traits(m.tok_embd->type);
    const std::vector<LayerConfig>& layers = m.layers_for(params.n_ctx_seq);
    const size_t erow = row_bytes(m.tok_embd->type, E);
    const float embd_scale = m.arch->embd_scale(hp);
    for (int32_t i = 0; i < n; ++i) {
        float* row = &embd[i * E];
        et.dequantize_row(m.tok_embd->data + (size_t)tokens[i] * erow, row, E);
        if (embd_scale != 1.0f)
            for (int64_t j = 0; j < E; ++j) row[j] *= embd_scale;
    }
    // Each layer's rows of per_layer_token_embd, layer by layer, so that a layer's are contiguous.
    const int64_t P = hp.n_embd_per_layer;
    if (P > 0) {
        const TypeTraits& pt = type_traits(m.per_layer_tok_embd->type);
        const size_t prow = row_bytes(m.per_layer_tok_embd->type, hp.n_layer * P);
        std::vector<float> row(hp.n_layer * P);
        for (int32_t i = 0; i < n; ++i) {
            pt.dequantize_row(m.per_layer_tok_embd->data + (size_t)tokens[i] * prow, row.data(), hp.n_layer * P);
            for (int32_t l = 0; l < hp.n_layer; ++l) std::copy_n(&row[l * P], P, &per_layer[((size_t)l * n + i) * P]);
        }
    }

    // The step's shape for recorded graphs: its size and the rows whose logits it computes.
    uint64_t shape_key = mix(mix(reinterpret_cast<uintptr_t>(this), (uint64_t)n), (uint64_t)greedy);
    for (const RowRange& rr : rows) shape_key = mix(mix(shape_key, (uint64_t)rr.first), (uint64_t)rr.count);
    // Recurrent layers run each sequence's tokens as one run of ops on its state slot, addressed from the
    // host: which tokens form a run and which slot it updates are part of the recorded ops.
    if (state.n_slots() > 0) {
        for (int32_t i = 0; i < n; ++i) shape_key = mix(shape_key, (uint64_t)batch.seq[i]);
        for (int32_t slot : batch.state_slot) shape_key = mix(shape_key, (uint64_t)slot);
    }

    Backend* cur = cpu.get();
    bool replayed = false;   // the device ops ran as a recorded graph
    // A step that throws after step_begin must not leave a graph capture open: the next free or
    // synchronize on that device would fail, wherever it happens.
    struct OpenStep {
        Backend* be = nullptr;
        ~OpenStep() {
            if (be && std::uncaught_exceptions()) be->step_abort();
        }
    } open_step;
    Scratch* s = nullptr;
    const float* pending = nullptr;   // the last block's output, still to be added to s->x
    std::vector<Backend*> seen;
    // Moves the hidden state to `be` (through host memory), the pending addition done first.
    auto move_to = [&](Backend& be, Scratch& next) {
        if (!s) {
            be.copy_from_host(next.x, embd.data(), n * E * sizeof(float));
            return;
        }
        if (pending) cur->add(s->x, pending, n * E);
        pending = nullptr;
        if (be.is_host()) {
            cur->copy_to_host(next.x, s->x, n * E * sizeof(float));
        } else {
            std::vector<float> tmp(n * E);
            cur->copy_to_host(tmp.data(), s->x, tmp.size() * sizeof(float));
            be.copy_from_host(next.x, tmp.data(), tmp.size() * sizeof(float));
        }
    };
    // Streamed weights stage one sequence's KV blocks.
    const bool streamed = stream && n >= StreamedWeights::kMinTokens && batch.n_seq == 1;
    std::vector<int32_t> ids;
    if (streamed) ids.assign(batch.block_table.begin(), batch.block_table.begin() + batch.max_blocks);
    const int32_t n_past = n > 0 ? batch.pos[0] : 0;
    auto is_streamed = [&](int32_t l) { return streamed && m.plan.block[l] == Device::cpu; };
    // Large batches run the remote experts on the GPU, streamed (remote_experts.h).
    const bool experts_streamed = expert_stream && n >= ExpertStream::kMinTokens;
    auto next_remote = [&](int32_t l) {
        while (++l < hp.n_layer)
            if (remote[l].be) return l;
        return -1;
    };
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        const bool st = is_streamed(l);
        BlockWeights staged;   // a streamed block's weights on the GPU for this step
        const bool experts_staged = experts_streamed && remote[l].be;
        if (st) staged = stream->begin_block(l, kv[l], ids, n_past);
        else if (experts_staged) staged = expert_stream->begin_block(l, blocks[l]);
        const BlockWeights& w = st || experts_staged ? staged : blocks[l];
        Backend& be = *w.backend;
        if (!s || s->be != &be) {
            Scratch& next = scratch_for(be);
            if (std::find(seen.begin(), seen.end(), &be) == seen.end()) {
                be.set_batch(batch);
                seen.push_back(&be);
                if (P > 0) {
                    be.copy_from_host(next.embd, embd.data(), n * E * sizeof(float));
                    be.copy_from_host(next.per_layer, per_layer.data(), (size_t)hp.n_layer * n * P * sizeof(float));
                }
            }
            move_to(be, next);
            s = &next;
            cur = &be;
            // When this device runs every remaining block and the head, the rest of the step is
            // device ops only: the backend may replay it as a graph recorded for the same shapes.
            // Experts apart from their block wait on the host mid-step, so such a step is never one graph.
            const bool rest_here = !streamed && head.backend == &be &&
                                   std::all_of(blocks.begin() + l, blocks.end(),
                                               [&](const BlockWeights& b) { return b.backend == &be; }) &&
                                   std::none_of(remote.begin() + l, remote.end(),
                                                [](const RemoteExperts& e) { return e.be != nullptr; });
            if (rest_here) {
                open_step.be = &be;
                if (be.step_begin(mix(shape_key, (uint64_t)l))) {
                    replayed = true;
                    break;
                }
            }
        }
        const RemoteExperts* apart = remote[l].be && !experts_staged ? &remote[l] : nullptr;
        if (apart && std::find(seen.begin(), seen.end(), apart->be) == seen.end()) {
            apart->be->set_batch(batch);
            seen.push_back(apart->be);
        }
        BlockRun run{be,       w,     layers[l],      hp,      st ? stream->kv() : kv[hp.kv_layer(l)],
                     s->buf,   n,     s->x,           pending, s->out_a,
                     s->out_b, apart, state.layer(l), &batch};
        if (P > 0) {
            run.embd = s->embd;
            run.per_layer = s->per_layer + (size_t)l * n * P;
        }
        pending = m.arch->forward_block(run);
        if (st) stream->end_block(l, kv[l], ids, n_past, n, l + 1 < hp.n_layer && is_streamed(l + 1));
        if (experts_staged) expert_stream->end_block(l, next_remote(l));
    }

    // Head: the blocks' last device is the head's device whenever any block is on the GPU.
    Backend& hb = *head.backend;
    Scratch& hs = scratch_for(hb);
    if (&hb != cur) {
        move_to(hb, hs);
        cur = &hb;
    }
    int32_t n_rows = 0;
    for (const RowRange& rr : rows) n_rows += rr.count;
    const int64_t W = row_width();
    if (hs.logits_rows < n_rows) {
        hs.logits = alloc_floats(hb, (int64_t)n_rows * W);
        hs.ids = alloc_array<int32_t>(hb, n_rows);
        hs.logits_rows = n_rows;
    }
    if (!replayed) {
        const LogitMap lm = m.arch->logit_map(hp);
        const bool map_logits = !params.embeddings && (lm.scale != 1.0f || lm.softcap > 0.0f);
        int32_t out = 0;
        for (const RowRange& rr : rows) {
            float* x = hs.x + rr.first * E;
            const float* res = pending ? pending + rr.first * E : nullptr;
            float* y = hs.logits + (size_t)out * W;
            // Embeddings: the normed rows go straight to the output buffer, with no head matmul.
            if (m.arch->layernorm_head()) {
                if (res) hb.add(x, res, (int64_t)rr.count * E);
                float* xn = params.embeddings ? y : hs.buf.xn + rr.first * E;
                hb.layernorm(x, head.output_norm, nullptr, rr.count, (int32_t)E, hp.rms_eps, xn);
                if (!params.embeddings) hb.matmul(head.output, xn, rr.count, y);
            } else if (params.embeddings) hb.add_rmsnorm(x, res, head.output_norm, rr.count, (int32_t)E, hp.rms_eps, y);
            else
                hb.norm_matmul(x, res, head.output_norm, hp.rms_eps, head.output, rr.count, hs.buf.xn + rr.first * E,
                               y);
            if (map_logits) hb.scale_softcap(y, (int64_t)rr.count * W, lm.scale, lm.softcap);
            out += rr.count;
        }
        if (greedy) hb.argmax_rows(hs.logits, n_rows, W, hs.ids);
    }
    hb.step_end();
    if (greedy) {
        greedy_ids.resize(n_rows);
        if (n_rows) hb.copy_to_host(greedy_ids.data(), hs.ids, (size_t)n_rows * sizeof(int32_t));
        else hb.synchronize();
        return;
    }
    const size_t n_out = (size_t)n_rows * W;
    if (n_out) hb.copy_to_host(logits.append(hb, n_out), hs.logits, n_out * sizeof(float));
    else hb.synchronize();
    n_logits += n_rows;
}

void Runner::forward(const int32_t* tokens, const BatchInfo& batch, const std::vector<RowRange>& rows, bool greedy) {
    RunnerImpl& r = *impl_;
    if (greedy && r.params.embeddings)
        fail("a forward step of an embeddings runner has no logits to take greedy ids from");
    if (batch.n_tok <= 0 || batch.n_tok > r.params.n_batch)
        fail("a forward step takes 1..", r.params.n_batch, " tokens, got ", batch.n_tok);
    if (r.state.n_slots() > 0) {
        if ((int32_t)batch.state_slot.size() != batch.n_seq)
            fail("a hybrid model's step needs a state slot per sequence: ", batch.n_seq, " sequences, ",
                 batch.state_slot.size(), " slots");
        for (int32_t slot : batch.state_slot)
            if (slot < 0 || slot >= r.state.n_slots())
                fail("state slot ", slot, " out of range [0, ", r.state.n_slots(), ")");
    } else if (has_recurrent_layers(r.model->hparams())) {
        fail(r.model->hparams().arch, " has recurrent layers, and this runner keeps no state slots (n_state_slots 0)");
    }
    int32_t end = 0;
    for (const RowRange& rr : rows) {
        if (rr.count <= 0 || rr.first < end || rr.first + rr.count > batch.n_tok)
            fail("logit rows [", rr.first, ", ", rr.first + rr.count, ") are empty, overlap or exceed the step's ",
                 batch.n_tok, " tokens");
        end = rr.first + rr.count;
    }
    r.forward(tokens, batch, rows, greedy);
}

const std::vector<int32_t>& Runner::greedy_ids() const { return impl_->greedy_ids; }

const float* Runner::logits() const { return impl_->logits.data(); }
int32_t Runner::n_logits() const { return impl_->n_logits; }
int32_t Runner::row_width() const { return impl_->row_width(); }
void Runner::clear_logits() {
    impl_->logits.clear();
    impl_->n_logits = 0;
}

void RunnerImpl::copy_host(const std::vector<std::pair<int32_t, int32_t>>& pairs, bool to_host) {
    const char* fn = to_host ? "copy_blocks_to_host" : "copy_blocks_from_host";
    if (host_tier.n_slots() == 0) fail("Runner.", fn, ": the runner has no host tier (n_host_tier_slots = 0)");
    for (auto [from, to] : pairs) {
        const int32_t dev = to_host ? from : to, host = to_host ? to : from;
        if (dev < 0 || dev >= params.n_kv_blocks)
            fail("Runner.", fn, ": KV block ", dev, " out of range [0, ", params.n_kv_blocks, ")");
        if (host < 0 || host >= host_tier.n_slots())
            fail("Runner.", fn, ": host slot ", host, " out of range [0, ", host_tier.n_slots(), ")");
    }
    const std::vector<CopyRun> runs = copy_runs(pairs);
    const HParams& hp = model->hparams();
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        const int64_t width = hp.kv_width(l);
        if (width == 0) continue;
        KVLayer& layer = kv[l];
        Backend& be = *blocks[l].backend;
        for (auto [dev, host, type] :
             {std::tuple{layer.k, host_tier.k(l), layer.k_type}, std::tuple{layer.v, host_tier.v(l), layer.v_type}}) {
            const size_t bytes = kv_block_bytes(type, layer.block_size, width);
            auto* d = static_cast<uint8_t*>(dev);
            for (const CopyRun& run : runs) {
                if (to_host)
                    be.copy_to_host_async(host + (size_t)run.dst * bytes, d + (size_t)run.src * bytes, run.n * bytes);
                else be.copy_from_host(d + (size_t)run.dst * bytes, host + (size_t)run.src * bytes, run.n * bytes);
            }
        }
    }
    // The copies to the host run behind each other (a synchronous copy would wait per run and
    // layer); they are all done once each backend has caught up.
    if (!to_host) return;
    std::vector<Backend*> seen;
    for (const BlockWeights& b : blocks)
        if (std::find(seen.begin(), seen.end(), b.backend) == seen.end()) {
            b.backend->synchronize();
            seen.push_back(b.backend);
        }
}

void Runner::copy_blocks_to_host(const std::vector<std::pair<int32_t, int32_t>>& dev_to_host) {
    impl_->copy_host(dev_to_host, true);
}

void Runner::copy_blocks_from_host(const std::vector<std::pair<int32_t, int32_t>>& host_to_dev) {
    impl_->copy_host(host_to_dev, false);
}

void Runner::clear_state(int32_t slot) {
    if (impl_->state.n_slots() > 0) impl_->state.clear(slot);
}

std::vector<float> Runner::save_state(int32_t slot) const { return impl_->state.save(slot); }

void Runner::restore_state(int32_t slot, const std::vector<float>& saved) { impl_->state.restore(slot, saved); }

int64_t Runner::state_slot_floats() const { return impl_->state.slot_floats(); }

HostParallelFor Runner::parallel_for() const { return impl_->cpu->host_parallel_for(); }

size_t Runner::kv_block_bytes_all_layers() const {
    const RunnerParams& p = impl_->params;
    return kv_block_bytes_model(impl_->model->hparams(), p.kv_block_size, p.type_k, p.type_v);
}
const Model& Runner::model() const { return *impl_->model; }
std::shared_ptr<Model> Runner::model_ptr() const { return impl_->model; }
const RunnerParams& Runner::params() const { return impl_->params; }

}  // namespace ember
