// Context: one sequence's paged KV cache and the llama-family forward over batches of tokens.
// Per batch: embedding rows (host) -> blocks on their devices (the hidden state crosses a device
// boundary only where placement changes) -> final norm + output head -> logits (host). Large
// batches run CPU blocks on the GPU too, on weights and KV copied there for the step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "cpu/cpu_backend.h"
#include "ember/status.h"
#include "kv/block_allocator.h"
#include "backend/kv_layout.h"
#include "model/model_impl.h"

namespace ember {

namespace {

// Batches of at least this many tokens run CPU-resident blocks on the GPU on streamed weights
// (llama.cpp offloads from the same batch size). Above the decode-graph batch sizes (<= 8), so
// a streamed step is never captured.
constexpr int32_t kStreamMinTokens = 32;

// Activation buffers of one backend, each [n_batch][width] floats.
struct Scratch {
    Backend* be = nullptr;
    float *x = nullptr, *xn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr,
          *gate = nullptr, *up = nullptr, *logits = nullptr;
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
    std::vector<BlockWeights> blocks;   // per block, on its device
    HeadWeights head;
    std::map<Backend*, Scratch> scratch;
    std::vector<std::pair<Backend*, void*>> owned;   // every allocation, freed at the end
    BlockAllocator alloc;
    BlockTable table;
    std::vector<KVLayer> kv;
    // Streaming (null: CPU blocks always run on the CPU); destroyed before `cpu` (whose pool it
    // uses) and `model` (whose GPU backend it uses).
    std::unique_ptr<WeightStream> stream;
    KVLayer stream_kv;   // on the GPU, geometry of a CPU block's kv[l]: its KV during a streamed step
    int32_t n_past = 0;
    HostLogits logits;   // [n_logits][n_vocab]; declared after `cpu` and `model`, whose host memory it holds
    int32_t n_logits = 0;
    std::vector<float> embd;     // [n_batch][n_embd] host staging for the embedding rows

    ContextImpl(std::shared_ptr<Model> m, const ContextParams& p, int32_t n_blocks)
        : model(std::move(m)), params(p), alloc(n_blocks), table(alloc, p.kv_block_size) {}

    ~ContextImpl() {
        for (auto& [be, ptr] : owned) be->free(ptr);
    }

    // Bytes of K (or V) of one layer: all blocks of the sequence.
    size_t kv_layer_bytes() const {
        const HParams& hp = model->hparams();
        const int64_t width = (int64_t)hp.n_head_kv * hp.head_dim;
        return (size_t)alloc.n_blocks() * kv_block_bytes(params.kv_type, params.kv_block_size, width);
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
        s.be = &be;
        s.x = alloc_floats(be, B * hp.n_embd);
        s.xn = alloc_floats(be, B * std::max<int64_t>(hp.n_embd, (int64_t)hp.n_head * hp.head_dim));
        s.q = alloc_floats(be, B * hp.n_head * hp.head_dim);
        s.k = alloc_floats(be, B * hp.n_head_kv * hp.head_dim);
        s.v = alloc_floats(be, B * hp.n_head_kv * hp.head_dim);
        s.att = alloc_floats(be, B * hp.n_head * hp.head_dim);
        s.gate = alloc_floats(be, B * hp.n_ff);
        s.up = alloc_floats(be, B * hp.n_ff);
        return s;
    }

    void forward(const int32_t* tokens, int32_t n, bool logits_all);
    void open_stream(ThreadPool& pool);
    void copy_kv_blocks(const KVLayer& from, KVLayer& to, int32_t b0, int32_t b1, bool to_gpu);
};

// Staging for streamed steps: GPU memory for two blocks' weights and one KV layer. Without it
// (too little GPU memory), CPU blocks run on the CPU for every batch.
void ContextImpl::open_stream(ThreadPool& pool) {
    ModelImpl& m = model->impl();
    StreamSetup su;
    su.blocks.resize(blocks.size());
    for (size_t l = 0; l < blocks.size(); ++l) {
        const BlockWeights& w = blocks[l];
        if (!m.on_gpu[l]) su.blocks[l] = {w.wq, w.wk, w.wv, w.wo, w.w_gate, w.w_up, w.w_down};
    }
    su.parallel_for = [&pool](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
        pool.parallel_for(n, grain, fn);
    };
    su.verbose = m.params.verbose;
    const HParams& hp = m.hp;
    const size_t kv_bytes = kv_layer_bytes();
    try {
        stream = m.gpu->open_stream(su);
        if (stream) {
            void* p = m.gpu->alloc(2 * kv_bytes);
            owned.emplace_back(m.gpu.get(), p);
            stream_kv = KVLayer{params.kv_type, p, static_cast<uint8_t*>(p) + kv_bytes, alloc.n_blocks(),
                                params.kv_block_size, hp.n_head_kv, hp.head_dim};
        }
    } catch (const std::exception& e) {
        stream.reset();
        if (m.params.verbose)
            std::fprintf(stderr, "ember: prompt batches run the CPU blocks on the CPU (no GPU staging: %s)\n", e.what());
    }
}

// Copies KV blocks [b0, b1) of the sequence (physical ids from the block table) between a host
// layer and the GPU staging layer; runs of consecutive ids go as one copy.
void ContextImpl::copy_kv_blocks(const KVLayer& from, KVLayer& to, int32_t b0, int32_t b1, bool to_gpu) {
    Backend& gpu = *model->impl().gpu;
    const std::vector<int32_t>& ids = table.blocks();
    const size_t block_bytes = kv_block_bytes(from.type, from.block_size, (int64_t)from.n_head_kv * from.head_dim);
    for (int32_t b = b0; b < b1;) {
        int32_t e = b + 1;
        while (e < b1 && ids[e] == ids[e - 1] + 1) ++e;
        const size_t off = (size_t)ids[b] * block_bytes, bytes = (size_t)(e - b) * block_bytes;
        for (int kv = 0; kv < 2; ++kv) {
            const uint8_t* src = static_cast<const uint8_t*>(kv ? from.v : from.k) + off;
            uint8_t* dst = static_cast<uint8_t*>(kv ? to.v : to.k) + off;
            if (to_gpu) gpu.copy_from_host(dst, src, bytes);
            else stream->copy_to_host_async(dst, src, bytes);
        }
        b = e;
    }
}

Context::Context(std::shared_ptr<Model> model, const ContextParams& params) {
    if (params.n_ctx <= 0) fail("n_ctx must be positive, got ", params.n_ctx);
    if (params.n_batch <= 0) fail("n_batch must be positive, got ", params.n_batch);
    if (params.kv_block_size <= 0) fail("kv_block_size must be positive, got ", params.kv_block_size);
    if (params.n_threads < 0) fail("n_threads must be >= 0, got ", params.n_threads);
    ModelImpl& m = model->impl();
    check_kv_type(params.kv_type, m.hp.head_dim);
    if (params.kv_type == GGMLType::F32 && m.any_gpu())
        fail("an f32 KV cache is available for CPU blocks only; use the f16 or q8_0 cache with n_gpu_layers != 0");
    if (!params.offload_kqv && m.any_gpu())
        fail("offload_kqv=False (KV of GPU blocks in host memory) is not available in this build of ember; "
             "use offload_kqv=True or n_gpu_layers=0");
    const int32_t n_blocks = (params.n_ctx + params.kv_block_size - 1) / params.kv_block_size;
    impl_ = std::make_unique<ContextImpl>(std::move(model), params, n_blocks);
    ContextImpl& c = *impl_;
    c.params.n_batch = std::min(params.n_batch, params.n_ctx);
    const int n_threads = params.n_threads > 0 ? params.n_threads
                                               : (int)std::max(1u, std::thread::hardware_concurrency());
    auto cpu = std::make_unique<CpuBackend>(n_threads);
    ThreadPool& pool = cpu->pool();
    c.cpu = std::move(cpu);
    const HParams& hp = m.hp;
    c.blocks.resize(hp.n_layer);
    for (int32_t l = 0; l < hp.n_layer; ++l)
        c.blocks[l] = m.on_gpu[l] ? m.gpu_blocks[l] : prepare_block(*c.cpu, m.blocks[l]);
    c.head = m.any_gpu() ? m.gpu_head : prepare_head(*c.cpu, *m.output, *m.output_norm);
    // EMBER_STREAM=0: CPU blocks stay on the CPU for every batch (diagnosis, comparisons).
    const char* stream_env = std::getenv("EMBER_STREAM");
    if (m.any_gpu() && !(stream_env && std::string(stream_env) == "0") &&
        std::find(m.on_gpu.begin(), m.on_gpu.end(), false) != m.on_gpu.end())
        c.open_stream(pool);
    c.kv.resize(hp.n_layer);
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        KVLayer& kv = c.kv[l];
        Backend& be = *c.blocks[l].backend;
        kv.n_blocks = n_blocks;
        kv.block_size = params.kv_block_size;
        kv.n_head_kv = hp.n_head_kv;
        kv.head_dim = hp.head_dim;
        kv.type = params.kv_type;
        const size_t bytes = c.kv_layer_bytes();
        for (void** p : {&kv.k, &kv.v}) {
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
    const int64_t E = hp.n_embd, QW = (int64_t)hp.n_head * hp.head_dim;
    const int64_t KW = (int64_t)hp.n_head_kv * hp.head_dim;

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
    for (int32_t i = 0; i < n; ++i) et.dequantize_row(m.tok_embd->data + (size_t)tokens[i] * erow, &embd[i * E], E);

    Backend* cur = cpu.get();
    const int32_t first = logits_all ? 0 : n - 1;   // first token whose logits are kept
    bool replayed = false;                          // the device ops ran as a recorded graph
    const float* x_src = embd.data();   // where the hidden state is before block 0
    Scratch* s = nullptr;
    std::vector<Backend*> seen;
    const AttentionShape shape{hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt((float)hp.head_dim)};
    // A streamed step runs CPU blocks on the GPU: block l reads staging set l % 2 while block
    // l+1's weights upload into the other; its KV blocks go to stream_kv and the new ones come back.
    const bool streamed = stream && n >= kStreamMinTokens;
    std::vector<Weight> staged;   // the next streamed block's weights, already uploading
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        const bool st = streamed && !m.on_gpu[l];
        BlockWeights sw;
        if (st) {
            if (staged.empty()) staged = stream->upload(l % 2, l);
            sw = m.stream_blocks[l];
            sw.wq = staged[0], sw.wk = staged[1], sw.wv = staged[2], sw.wo = staged[3];
            sw.w_gate = staged[4], sw.w_up = staged[5], sw.w_down = staged[6];
            staged.clear();
        }
        const BlockWeights& w = st ? sw : blocks[l];
        Backend& be = *w.backend;
        if (!s || s->be != &be) {
            Scratch& next = scratch_for(be);
            if (std::find(seen.begin(), seen.end(), &be) == seen.end()) {
                be.set_batch(batch);
                seen.push_back(&be);
            }
            // Move the hidden state to this block's device (through host memory).
            if (!s) {
                be.copy_from_host(next.x, x_src, n * E * sizeof(float));
            } else if (be.is_host()) {
                cur->copy_to_host(next.x, s->x, n * E * sizeof(float));
            } else {
                std::vector<float> tmp(n * E);
                cur->copy_to_host(tmp.data(), s->x, tmp.size() * sizeof(float));
                be.copy_from_host(next.x, tmp.data(), tmp.size() * sizeof(float));
            }
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
        if (st) stream->acquire(l % 2);
        be.rmsnorm(s->x, w.attn_norm, n, (int32_t)E, hp.rms_eps, s->xn);
        {
            const Weight* qkv[3] = {&w.wq, &w.wk, &w.wv};
            float* out[3] = {s->q, s->k, s->v};
            be.matmul_many(qkv, out, 3, s->xn, n);
        }
        if (w.bq) be.add_bias(s->q, w.bq, n, (int32_t)QW);
        if (w.bk) be.add_bias(s->k, w.bk, n, (int32_t)KW);
        if (w.bv) be.add_bias(s->v, w.bv, n, (int32_t)KW);
        // A streamed block attends in the GPU staging layer: positions [0, n_past) go in here (no
        // fusable op is pending), the blocks holding the batch's positions come back out.
        KVLayer& lkv = st ? stream_kv : kv[l];
        const int32_t bs = kv[l].block_size;
        if (st) copy_kv_blocks(kv[l], stream_kv, 0, (n_past + bs - 1) / bs, true);
        be.rope(s->q, n, hp.n_head, hp.head_dim, hp.rope_base, hp.rope_neox);
        be.rope(s->k, n, hp.n_head_kv, hp.head_dim, hp.rope_base, hp.rope_neox);
        be.kv_store(lkv, s->k, s->v, n);
        be.attention(lkv, s->q, n, shape, s->att);
        if (st) copy_kv_blocks(stream_kv, kv[l], n_past / bs, (n_past + n - 1) / bs + 1, false);
        be.matmul(w.wo, s->att, n, s->xn);
        be.add(s->x, s->xn, n * E);
        be.rmsnorm(s->x, w.ffn_norm, n, (int32_t)E, hp.rms_eps, s->xn);
        {
            const Weight* gate_up[2] = {&w.w_gate, &w.w_up};
            float* out[2] = {s->gate, s->up};
            be.matmul_many(gate_up, out, 2, s->xn, n);
        }
        be.swiglu(s->gate, s->up, n * hp.n_ff, s->gate);
        be.matmul(w.w_down, s->gate, n, s->xn);
        be.add(s->x, s->xn, n * E);
        if (st) {
            stream->release(l % 2);
            if (l + 1 < hp.n_layer && !m.on_gpu[l + 1]) staged = stream->upload((l + 1) % 2, l + 1);
        }
    }

    // Head: the blocks' last device is the head's device whenever any block is on the GPU.
    Backend& hb = *head.backend;
    Scratch& hs = scratch_for(hb);
    if (&hb != cur) {
        std::vector<float> tmp(n * E);
        cur->copy_to_host(tmp.data(), s->x, tmp.size() * sizeof(float));
        hb.copy_from_host(hs.x, tmp.data(), tmp.size() * sizeof(float));
    }
    const int32_t rows = n - first;
    if (hs.logits_rows < rows) {
        hs.logits = alloc_floats(hb, (int64_t)rows * hp.n_vocab);
        hs.logits_rows = rows;
    }
    if (!replayed) {
        hb.rmsnorm(hs.x + first * E, head.output_norm, rows, (int32_t)E, hp.rms_eps, hs.xn);
        hb.matmul(head.output, hs.xn, rows, hs.logits);
    }
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
