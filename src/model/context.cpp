// Context: one sequence's paged KV cache and the forward over batches of tokens. Per batch:
// embedding rows (host) -> each block's forward (its architecture's, on the device the placement
// plan gives it; the hidden state crosses a device boundary only where placement changes) ->
// final norm + output head -> logits (host). Large batches run CPU blocks on the GPU too, through
// the streamed offload.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "backend/kv_layout.h"
#include "backend/registry.h"
#include "ember/status.h"
#include "kv/block_allocator.h"
#include "model/model_impl.h"
#include "model/streamed_offload.h"

namespace ember {

namespace {

// Activation buffers of one backend, each [n_batch][width] floats: the hidden state x, the
// fused ops' buffers, and the two block outputs (out_a, out_b).
struct Scratch {
    Backend* be = nullptr;
    float *x = nullptr, *out_a = nullptr, *out_b = nullptr, *logits = nullptr;
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

}  // namespace

struct ContextImpl {
    std::shared_ptr<Model> model;
    ContextParams params;
    std::unique_ptr<Backend> cpu;
    std::vector<BlockWeights> blocks;   // per block, on its device (the plan's)
    HeadWeights head;
    std::map<Backend*, Scratch> scratch;
    std::vector<std::pair<Backend*, void*>> owned;   // every allocation, freed at the end
    BlockAllocator alloc;
    BlockTable table;
    std::vector<KVLayer> kv;
    // Null: CPU blocks always run on the CPU. Destroyed before `cpu` (whose pool it uses) and
    // `model` (whose GPU backend it uses).
    std::unique_ptr<StreamedOffload> stream;
    int32_t n_past = 0;
    HostLogits logits;   // [n_logits][n_vocab]; declared after `cpu` and `model`, whose host memory it holds
    int32_t n_logits = 0;
    std::vector<float> embd;     // [n_batch][n_embd] host staging for the embedding rows

    ContextImpl(std::shared_ptr<Model> m, const ContextParams& p, int32_t n_blocks)
        : model(std::move(m)), params(p), alloc(n_blocks), table(alloc, p.kv_block_size) {}

    ~ContextImpl() {
        for (auto& [be, ptr] : owned) be->free(ptr);
    }

    // Bytes of K or V (of element type t) of one layer: all blocks of the sequence.
    size_t kv_layer_bytes(GGMLType t) const {
        const HParams& hp = model->hparams();
        const int64_t width = (int64_t)hp.n_head_kv * hp.head_dim;
        return (size_t)alloc.n_blocks() * kv_block_bytes(t, params.kv_block_size, width);
    }

    float* alloc_floats(Backend& be, int64_t n) {
        void* p = be.alloc((size_t)n * sizeof(float));
        owned.emplace_back(&be, p);
        return static_cast<float*>(p);
    }

    Scratch& scratch_for(Backend& be) {
        Scratch& s = scratch[&be];
        if (s.be) return s;
        const HParams& hp = model->hparams();
        const int64_t B = params.n_batch;
        const int64_t QW = (int64_t)hp.n_head * hp.head_dim, KW = (int64_t)hp.n_head_kv * hp.head_dim;
        s.be = &be;
        s.x = alloc_floats(be, B * hp.n_embd);
        s.out_a = alloc_floats(be, B * hp.n_embd);
        s.out_b = alloc_floats(be, B * hp.n_embd);
        s.buf.xn = alloc_floats(be, B * hp.n_embd);
        s.buf.q = alloc_floats(be, B * QW);
        s.buf.k = alloc_floats(be, B * KW);
        s.buf.v = alloc_floats(be, B * KW);
        s.buf.att = alloc_floats(be, B * QW);
        s.buf.gate = alloc_floats(be, B * hp.n_ff);
        s.buf.up = alloc_floats(be, B * hp.n_ff);
        return s;
    }

    void forward(const int32_t* tokens, int32_t n, bool logits_all);
};

Context::Context(std::shared_ptr<Model> model, const ContextParams& params) {
    if (params.n_ctx <= 0) fail("n_ctx must be positive, got ", params.n_ctx);
    if (params.n_batch <= 0) fail("n_batch must be positive, got ", params.n_batch);
    if (params.kv_block_size <= 0) fail("kv_block_size must be positive, got ", params.kv_block_size);
    if (params.n_threads < 0) fail("n_threads must be >= 0, got ", params.n_threads);
    ModelImpl& m = model->impl();
    check_kv_type(params.type_k, m.hp.head_dim, "type_k");
    check_kv_type(params.type_v, m.hp.head_dim, "type_v");
    if ((params.type_k == GGMLType::F32 || params.type_v == GGMLType::F32) && m.any_gpu())
        fail("an f32 KV cache (type_k or type_v) is available for CPU blocks only; use f16 or q8_0 with "
             "n_gpu_layers != 0");
    if (!params.offload_kqv && m.any_gpu())
        fail("offload_kqv=False (KV of GPU blocks in host memory) is not available in this build of ember; "
             "use offload_kqv=True or n_gpu_layers=0");
    const int32_t n_blocks = (params.n_ctx + params.kv_block_size - 1) / params.kv_block_size;
    impl_ = std::make_unique<ContextImpl>(std::move(model), params, n_blocks);
    ContextImpl& c = *impl_;
    c.params.n_batch = std::min(params.n_batch, params.n_ctx);
    BackendOptions opts;
    opts.n_threads = params.n_threads > 0 ? params.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    c.cpu = make_backend("cpu", opts);
    const HParams& hp = m.hp;
    c.blocks.resize(hp.n_layer);
    for (int32_t l = 0; l < hp.n_layer; ++l)
        c.blocks[l] = m.plan.block[l] == Device::gpu ? m.gpu_blocks[l] : prepare_block(*c.cpu, m.blocks[l]);
    c.head = m.plan.head == Device::gpu ? m.gpu_head : prepare_head(*c.cpu, *m.output, *m.output_norm);
    KVLayer geometry;
    geometry.k_type = params.type_k;
    geometry.v_type = params.type_v;
    geometry.n_blocks = n_blocks;
    geometry.block_size = params.kv_block_size;
    geometry.n_head_kv = hp.n_head_kv;
    geometry.head_dim = hp.head_dim;
    // EMBER_STREAM=0: CPU blocks stay on the CPU for every batch (diagnosis, comparisons).
    const char* stream_env = std::getenv("EMBER_STREAM");
    if (m.plan.any_gpu() && m.plan.any_cpu() && !(stream_env && std::string(stream_env) == "0"))
        c.stream = StreamedOffload::open(m, c.blocks, *c.cpu, geometry);
    c.kv.assign(hp.n_layer, geometry);
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        KVLayer& kv = c.kv[l];
        Backend& be = *c.blocks[l].backend;
        for (auto [p, type] : {std::pair{&kv.k, kv.k_type}, std::pair{&kv.v, kv.v_type}}) {
            const size_t bytes = c.kv_layer_bytes(type);
            // A streamed block's host KV is pinned, so its copies run asynchronously at full speed.
            *p = be.is_host() && c.stream ? c.stream->alloc_host(bytes) : nullptr;
            if (!*p) {
                *p = be.alloc(bytes);
                c.owned.emplace_back(&be, *p);
            }
        }
    }
    c.embd.resize((size_t)c.params.n_batch * hp.n_embd);
}

Context::~Context() = default;

void ContextImpl::forward(const int32_t* tokens, int32_t n, bool logits_all) {
    ModelImpl& m = model->impl();
    const HParams& hp = m.hp;
    const int64_t E = hp.n_embd;

    table.reserve_tokens(n_past + n);
    BatchInfo batch;
    batch.n_tok = n;
    batch.n_seq = 1;
    batch.max_blocks = (int32_t)table.blocks().size();
    batch.block_table = table.blocks();
    for (int32_t i = 0; i < n; ++i) {
        batch.pos.push_back(n_past + i);
        batch.seq.push_back(0);
    }

    // Embedding rows stay in host memory (token_embd may be the largest tensor).
    const TypeTraits& et = type_traits(m.tok_embd->type);
    const size_t erow = row_bytes(m.tok_embd->type, E);
    const float embd_scale = m.arch->embd_scale(hp);
    for (int32_t i = 0; i < n; ++i) {
        float* row = &embd[i * E];
        et.dequantize_row(m.tok_embd->data + (size_t)tokens[i] * erow, row, E);
        if (embd_scale != 1.0f)
            for (int64_t j = 0; j < E; ++j) row[j] *= embd_scale;
    }

    Backend* cur = cpu.get();
    const int32_t first = logits_all ? 0 : n - 1;   // first token whose logits are kept
    bool replayed = false;                          // the device ops ran as a recorded graph
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
    const bool streamed = stream && n >= StreamedOffload::kMinTokens;
    auto is_streamed = [&](int32_t l) { return streamed && m.plan.block[l] == Device::cpu; };
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        const bool st = is_streamed(l);
        BlockWeights staged;   // a streamed block's weights on the GPU for this step
        if (st) staged = stream->begin_block(l, kv[l], table.blocks(), n_past);
        const BlockWeights& w = st ? staged : blocks[l];
        Backend& be = *w.backend;
        if (!s || s->be != &be) {
            Scratch& next = scratch_for(be);
            if (std::find(seen.begin(), seen.end(), &be) == seen.end()) {
                be.set_batch(batch);
                seen.push_back(&be);
            }
            move_to(be, next);
            s = &next;
            cur = &be;
            // When this device runs every remaining block and the head, the rest of the step is
            // device ops only: the backend may replay it as a graph recorded for the same shapes.
            const bool rest_here = !streamed && head.backend == &be &&
                std::all_of(blocks.begin() + l, blocks.end(), [&](const BlockWeights& b) { return b.backend == &be; });
            if (rest_here && be.step_begin(reinterpret_cast<uintptr_t>(this) ^ ((uint64_t)n << 32) ^
                                           ((uint64_t)first << 48) ^ ((uint64_t)l << 24))) {
                replayed = true;
                break;
            }
        }
        const BlockRun run{be, w, m.layers[l], hp, st ? stream->kv() : kv[l], s->buf, n, s->x, pending, s->out_a, s->out_b};
        pending = m.arch->forward_block(run);
        if (st) stream->end_block(l, kv[l], table.blocks(), n_past, n, l + 1 < hp.n_layer && is_streamed(l + 1));
    }

    // Head: the blocks' last device is the head's device whenever any block is on the GPU.
    Backend& hb = *head.backend;
    Scratch& hs = scratch_for(hb);
    if (&hb != cur) {
        move_to(hb, hs);
        cur = &hb;
    }
    const int32_t rows = n - first;
    if (hs.logits_rows < rows) {
        hs.logits = alloc_floats(hb, (int64_t)rows * hp.n_vocab);
        hs.logits_rows = rows;
    }
    if (!replayed)
        hb.norm_matmul(hs.x + first * E, pending ? pending + first * E : nullptr, head.output_norm, hp.rms_eps,
                       head.output, rows, hs.buf.xn, hs.logits);
    hb.step_end();
    const size_t n_out = (size_t)rows * hp.n_vocab;
    hb.copy_to_host(logits.append(hb, n_out), hs.logits, n_out * sizeof(float));
    n_logits += rows;
    n_past += n;
}

void Context::eval(const int32_t* tokens, int32_t n, bool logits_all) {
    ContextImpl& c = *impl_;
    const int32_t n_vocab = c.model->hparams().n_vocab;
    if (n <= 0) fail("eval needs at least one token");
    if (c.n_past + n > c.params.n_ctx)
        fail("context overflow: ", c.n_past, " tokens in the cache + ", n, " new exceed n_ctx ", c.params.n_ctx);
    for (int32_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            fail("token id ", tokens[i], " at index ", i, " is out of range [0, ", n_vocab, ")");
    c.logits.clear();
    c.n_logits = 0;
    for (int32_t start = 0; start < n; start += c.params.n_batch) {
        const int32_t len = std::min(c.params.n_batch, n - start);
        const bool last_chunk = start + len == n;
        if (!logits_all && !last_chunk) {
            // Intermediate chunks of a prompt only fill the KV; their logits are dropped.
            c.forward(tokens + start, len, false);
            c.logits.clear();
            c.n_logits = 0;
        } else {
            c.forward(tokens + start, len, logits_all);
        }
    }
}

const float* Context::logits(int32_t i) const {
    const ContextImpl& c = *impl_;
    if (i < 0) i += c.n_logits;
    if (i < 0 || i >= c.n_logits) fail("logits index out of range: ", i, " (have ", c.n_logits, " rows)");
    return c.logits.data() + (size_t)i * c.model->hparams().n_vocab;
}

int32_t Context::n_logits() const { return impl_->n_logits; }
int32_t Context::n_past() const { return impl_->n_past; }
int32_t Context::n_ctx() const { return impl_->params.n_ctx; }
const Model& Context::model() const { return *impl_->model; }

void Context::truncate(int32_t n_past) {
    ContextImpl& c = *impl_;
    if (n_past < 0 || n_past > c.n_past) fail("truncate: n_past ", n_past, " must be in [0, ", c.n_past, "]");
    c.table.truncate(n_past);
    c.n_past = n_past;
}

}  // namespace ember
