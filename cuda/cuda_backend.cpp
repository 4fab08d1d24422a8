// The CUDA Backend: device memory, weight upload, batch metadata in fixed device buffers,
// op dispatch (GEMV for decode, dequantize + cuBLAS for prompts), the fused ops of a block
// (norm -> q8_1 activations -> GEMV, Q/K/V with rope and KV store, attention -> O projection,
// gate/up -> gated activation -> down), and decode-step CUDA graphs.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "kernels.h"
#include "launch.h"
#include "backend/backend.h"
#include "backend/kv_layout.h"
#include "rope_table.h"
#include "weight_pack.h"
#include "weight_stream.h"

namespace ember {

namespace cuda {

bool& pdl_enabled() {
    static bool on = false;
    return on;
}

int device_cc() {
    // Launch paths ask at every launch: the attributes are read once per device (0: not yet known).
    static std::atomic<int> known[64];
    int dev = 0;
    EMBER_CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<int>* slot = dev < 64 ? &known[dev] : nullptr;
    if (const int k = slot ? slot->load(std::memory_order_relaxed) : 0) return k;
    int major = 0, minor = 0;
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    const int cc = 10 * major + minor;
    if (slot) slot->store(cc, std::memory_order_relaxed);
    return cc;
}

bool device_is_sm90() { return device_cc() >= 90; }

bool env_flag(const char* name) {
    const char* v = std::getenv(name);
    return !(v && std::string(v) == "0");
}

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
    cudaGetLastError();   // clear a sticky launch error so the next call starts clean
    const std::string msg = cat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ",
                                what, " at ", file, ":", line);
    if (err == cudaErrorMemoryAllocation) throw OutOfMemory(msg);
    throw std::runtime_error(msg);
}

namespace {

#define EMBER_CUBLAS_CHECK(expr)                                                                   \
    do {                                                                                           \
        cublasStatus_t st_ = (expr);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            throw std::runtime_error(cat("cuBLAS error ", cublasGetStatusName(st_), " in ", #expr)); \
    } while (0)

constexpr double kMiB = 1024.0 * 1024.0;
// Prompts up to this many tokens take the decode kernels (integer GEMV in chunks of 8 tokens,
// CUDA-core attention): the same rounding as the reference CPU path, so short prompts and the
// text that follows them agree with it closely. Longer ones use the tensor cores.
constexpr int kMaxIntPromptTokens = 64;
constexpr int kKeysPerSplit = 64;      // flash-decoding: one split per this many keys
constexpr int kMaxGraphDecodeTokens = 256;   // engine decode steps up to this many sequences are graphed
constexpr int kTargetAttnCtas = 1024;  // split only while the grid is smaller than this
// Decode attention over long contexts: CTAs per launch the key-range split aims at. The q8_0
// kernel fits about 8 CTAs an SM; the f16 tensor-core kernel 2, and one wave of those beat both
// one CTA an SM and two waves (docs/performance.md).
constexpr int kDecodeTargetCtas = 1024;
constexpr int kDecodeMmaTargetCtas = 256;
constexpr int kNumTileLens = 5;
constexpr int kBatchHeadWords = 2 + 2 * kNumTileLens;   // int32 words per token slot before the block table
constexpr int kTileLens[kNumTileLens] = {1, 2, 4, 8, kMmaTileLen};   // attention tile lists kept per batch

int pow2_ceil(int v) {
    int p = 1;
    while (p < v) p <<= 1;
    return p;
}
int pow2_floor(int v) {
    int p = 1;
    while (p * 2 <= v) p <<= 1;
    return p;
}

uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

// env_opt_in: a switch read from the environment, off unless set to "1".
bool env_opt_in(const char* name) {
    const char* v = std::getenv(name);
    return v && std::string(v) == "1";
}

float bf16_bits_to_float(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(int device) : device_(device) {
        // EMBER_CUDA_GRAPHS=0 runs every step eagerly; EMBER_CUDA_FUSE=0 makes every fused op
        // (and matmul_many) take the Backend's default composition of primitives, one launch per
        // primitive; EMBER_CUDA_EXACT_ATTN=0 uses the flash-decoding kernel for short contexts
        // too; EMBER_CUDA_EXACT_CLUSTER=0 runs the short contexts' reference-order kernel one CTA
        // a head, as on GPUs before Hopper; EMBER_CUDA_PDL=0 turns off programmatic dependent
        // launch. For diagnosis and comparisons. EMBER_CUDA_SHORT_ATTN=1 lets the engine's
        // default-mode decode steps take attention_short (faster, but further from Llama's greedy
        // text). EMBER_CUDA_GRAPH_LOG=1 prints each step's graph outcome (replay, capture, eager)
        // and each invalidation to stderr: why a step shape does not replay.
        graphs_on_ = env_flag("EMBER_CUDA_GRAPHS");
        graph_log_ = env_opt_in("EMBER_CUDA_GRAPH_LOG");
        exact_attn_on_ = env_flag("EMBER_CUDA_EXACT_ATTN");
        exact_cluster_on_ = env_flag("EMBER_CUDA_EXACT_CLUSTER");
        short_attn_on_ = env_opt_in("EMBER_CUDA_SHORT_ATTN");
        fuse_on_ = env_flag("EMBER_CUDA_FUSE");
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess || n == 0) {
            cudaGetLastError();
            fail("cuda: no CUDA device is present (", cudaGetErrorString(e), ")");
        }
        if (device < 0 || device >= n) fail("cuda: device ", device, " does not exist (", n, " present)");
        EMBER_CUDA_CHECK(cudaSetDevice(device_));
        pdl_enabled() = device_is_sm90() && env_flag("EMBER_CUDA_PDL");
        EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_, cudaEventDisableTiming));
        EMBER_CUBLAS_CHECK(cublasCreate(&cublas_));
        EMBER_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
        // A fixed workspace keeps cuBLAS from allocating inside a captured graph.
        cublas_ws_ = alloc(kCublasWorkspace);
        EMBER_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, kCublasWorkspace));
    }

    ~CudaBackend() override {
        cudaSetDevice(device_);
        cudaStreamSynchronize(stream_);
        for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
        if (cublas_) cublasDestroy(cublas_);
        for (void* p : owned_) cudaFree(p);
        for (Scratch* s : {&xq_, &xds_, &xh_, &wh_, &batch_dev_, &part_acc_, &part_ml_, &split_ctr_, &kv_f16_}) cudaFree(s->p);
        cudaFree(cublas_ws_);
        if (staging_) cudaFreeHost(staging_);
        for (const HostBlock& h : host_blocks_) cudaFreeHost(h.p);   // (pinned_in_ and pinned_out_ among them)
        cudaEventDestroy(staging_done_);
        cudaStreamDestroy(stream_);
    }

    const char* name() const override { return "cuda"; }
    bool is_host() const override { return false; }

    void* alloc(size_t bytes) override {
        EMBER_CUDA_CHECK(cudaSetDevice(device_));
        void* p = nullptr;
        const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            throw OutOfMemory(cat("cuda: needed ", bytes / kMiB, " MiB, free ", free_b / kMiB, " MiB of ",
                                  total_b / kMiB, " MiB on GPU ", device_));
        }
        // A new buffer may replace one a recorded graph writes to (the caller's key cannot tell).
        invalidate_graphs();
        return p;
    }
    void free(void* p) override {
        issue_uploads();   // (a pending upload may write p)
        if (p) EMBER_CUDA_CHECK(cudaFree(p));
    }
    // Small copies wait in pinned memory as pending uploads (see issue_uploads); larger ones, and
    // any from memory already pinned (host KV blocks: no bounce copy, no wait for room), go now.
    void copy_from_host(void* dst, const void* src, size_t bytes) override {
        if (void* p = is_pinned(src, bytes) ? nullptr : pinned_input(bytes)) {
            std::memcpy(p, src, bytes);
            add_upload(dst, p, bytes);
            return;
        }
        issue_uploads();
        EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    }
    // Copies into memory from alloc_host land directly; other small copies (a decode step's
    // logits) go through a pinned bounce buffer: the 196 KB of a 49152-word vocabulary kept the
    // GPU idle 50-64 us a step from pageable memory (2-3% of a depth-0 step).
    void copy_to_host(void* dst, const void* src, size_t bytes) override {
        issue_uploads();
        const bool direct = bytes > kPinnedOutBytes || is_pinned(dst, bytes);
        if (!direct && !pinned_out_) pinned_out_ = alloc_host(kPinnedOutBytes);
        void* to = direct ? dst : pinned_out_;
        EMBER_CUDA_CHECK(cudaMemcpyAsync(to, src, bytes, cudaMemcpyDeviceToHost, stream_));
        EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
        if (to != dst) std::memcpy(dst, to, bytes);
    }
    // Into pinned memory the copy runs behind the ops; pageable memory takes the synchronous path.
    void copy_to_host_async(void* dst, const void* src, size_t bytes) override {
        if (!is_pinned(dst, bytes)) {
            copy_to_host(dst, src, bytes);
            return;
        }
        issue_uploads();
        EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    void copy(void* dst, const void* src, size_t bytes) override {
        issue_uploads();
        EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    }
    void synchronize() override {
        issue_uploads();
        EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void* alloc_host(size_t bytes) override {
        void* p = nullptr;
        if (cudaMallocHost(&p, bytes) != cudaSuccess) {
            cudaGetLastError();
            throw OutOfMemory(cat("cuda: could not pin ", bytes / kMiB, " MiB of host memory"));
        }
        host_blocks_.push_back(HostBlock{p, bytes});
        return p;
    }
    void free_host(void* p) override {
        issue_uploads();
        EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));   // no copy still writes it
        auto it = std::find_if(host_blocks_.begin(), host_blocks_.end(), [p](const HostBlock& h) { return h.p == p; });
        if (it == host_blocks_.end()) fail("cuda free_host: ", p, " did not come from alloc_host");
        host_blocks_.erase(it);
        EMBER_CUDA_CHECK(cudaFreeHost(p));
    }

    Weight prepare_weight(const GGUFTensor& t) override {
        if (t.ne.empty()) fail("cuda: tensor ", t.name, " has no dimensions");
        int64_t rows = 1;
        for (size_t i = 1; i < t.ne.size(); ++i) rows *= t.ne[i];
        Weight w;
        w.type = t.type;
        w.n_in = t.ne[0];
        w.n_out = rows;
        w.src = &t;
        const PackedLayout L = packed_layout(t.type, w.n_in, w.n_out);
        const size_t raw = size_t(L.n_blocks) * size_t(rows) * size_t(block_info(t.type).block_bytes);
        if (raw > t.nbytes) fail("cuda: tensor ", t.name, " holds ", t.nbytes, " bytes, its shape needs ", raw);
        void* d = alloc(L.total);
        owned_.push_back(d);
        if (L.qs_bytes == 0) {
            EMBER_CUDA_CHECK(cudaMemcpy(d, t.data, L.total, cudaMemcpyHostToDevice));
        } else {
            std::vector<uint8_t> packed(L.total);
            pack_weight(t.type, w.n_in, w.n_out, t.data, packed.data());
            EMBER_CUDA_CHECK(cudaMemcpy(d, packed.data(), L.total, cudaMemcpyHostToDevice));
        }
        w.data = d;
        return w;
    }

    const float* prepare_vector(const GGUFTensor& t) override {
        int64_t n = 1;
        for (int64_t v : t.ne) n *= v;
        std::vector<float> host(size_t(std::max<int64_t>(n, 0)));
        const uint16_t* h16 = reinterpret_cast<const uint16_t*>(t.data);
        switch (t.type) {
            case GGMLType::F32:
                if (t.nbytes < size_t(n) * 4) fail("cuda: vector ", t.name, " is truncated");
                std::memcpy(host.data(), t.data, size_t(n) * 4);
                break;
            case GGMLType::F16:
                if (t.nbytes < size_t(n) * 2) fail("cuda: vector ", t.name, " is truncated");
                for (int64_t i = 0; i < n; ++i) host[i] = __half2float(__ushort_as_half(h16[i]));
                break;
            case GGMLType::BF16:
                if (t.nbytes < size_t(n) * 2) fail("cuda: vector ", t.name, " is truncated");
                for (int64_t i = 0; i < n; ++i) host[i] = bf16_bits_to_float(h16[i]);
                break;
            default: fail("cuda: vector ", t.name, " must be F32, F16 or BF16, got type ", uint32_t(t.type));
        }
        void* d = alloc(host.size() * 4);
        owned_.push_back(d);
        EMBER_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
        return static_cast<const float*>(d);
    }

    // Positions, sequence ids, block table and attention tiles go to one fixed device buffer
    // through a pinned staging copy; offsets depend only on capacities, so a captured graph
    // stays valid while the contents change.
    void set_batch(const BatchInfo& b) override {
        issue_uploads();   // (the previous batch's upload reads the staging rewritten below)
        const int32_t n_tok = b.n_tok;
        if (n_tok < 0 || int64_t(b.pos.size()) < n_tok || int64_t(b.seq.size()) < n_tok)
            fail("cuda set_batch: n_tok ", n_tok, " but ", b.pos.size(), " positions and ", b.seq.size(), " sequence ids");
        if (int64_t(b.block_table.size()) < int64_t(b.n_seq) * b.max_blocks)
            fail("cuda set_batch: block table holds ", b.block_table.size(), " entries, need ", b.n_seq, " x ", b.max_blocks);
        int32_t max_pos = -1;
        for (int32_t t = 0; t < n_tok; ++t) {
            if (b.seq[t] < 0 || b.seq[t] >= b.n_seq) fail("cuda set_batch: token ", t, " has sequence ", b.seq[t], " of ", b.n_seq);
            if (b.pos[t] < 0) fail("cuda set_batch: token ", t, " has negative position ", b.pos[t]);
            max_pos = std::max(max_pos, b.pos[t]);
        }
        if (ropes_.reserve(max_pos + 1, stream_)) invalidate_graphs();
        // Capacities grow (never shrink); growing reallocates and invalidates recorded graphs.
        // The block table keeps a fixed row stride so a sequence growing by a block does not
        // change any kernel parameter.
        if (n_tok > cap_tok_ || b.n_seq > cap_seq_ || b.max_blocks > bt_stride_) {
            cap_tok_ = std::max(cap_tok_, pow2_ceil(std::max(n_tok, 8)));
            cap_seq_ = std::max(cap_seq_, pow2_ceil(std::max(b.n_seq, 1)));
            bt_stride_ = std::max(bt_stride_, pow2_ceil(std::max(b.max_blocks, 64)));
            invalidate_graphs();
        }
        // int32 layout: pos[cap_tok] seq[cap_tok] tiles[kNumTileLens][cap_tok][2] block_table[cap_seq][bt_stride]
        const size_t n_words = size_t(cap_tok_) * kBatchHeadWords + size_t(cap_seq_) * size_t(bt_stride_);
        ensure(batch_dev_, n_words * 4);
        if (staging_cap_ < n_words * 4) {
            EMBER_CUDA_CHECK(cudaEventSynchronize(staging_done_));
            if (staging_) EMBER_CUDA_CHECK(cudaFreeHost(staging_));
            staging_ = nullptr;
            EMBER_CUDA_CHECK(cudaMallocHost(&staging_, n_words * 4));
            staging_cap_ = n_words * 4;
            invalidate_graphs();   // recorded steps copy from the old staging
        }
        EMBER_CUDA_CHECK(cudaEventSynchronize(staging_done_));   // the previous step's copies have read it
        in_used_ = 0;
        int32_t* w = static_cast<int32_t*>(staging_);
        std::copy(b.pos.begin(), b.pos.begin() + n_tok, w);
        std::copy(b.seq.begin(), b.seq.begin() + n_tok, w + cap_tok_);
        for (int k = 0; k < kNumTileLens; ++k) {
            int32_t* tiles = w + 2 * cap_tok_ + size_t(k) * 2 * cap_tok_;
            int n = 0;
            for (int32_t t = 0; t < n_tok;) {
                int32_t e = t + 1;
                while (e < n_tok && e - t < kTileLens[k] && b.seq[e] == b.seq[t]) ++e;
                tiles[2 * n] = t;
                tiles[2 * n + 1] = e - t;
                ++n;
                t = e;
            }
            n_tiles_[k] = n;
        }
        int32_t* bt = w + kBatchHeadWords * size_t(cap_tok_);
        for (int32_t q = 0; q < b.n_seq; ++q)
            std::copy(b.block_table.begin() + int64_t(q) * b.max_blocks, b.block_table.begin() + int64_t(q + 1) * b.max_blocks,
                      bt + int64_t(q) * bt_stride_);
        add_upload(batch_dev_.p, staging_, n_words * 4);
        const int32_t* d = static_cast<const int32_t*>(batch_dev_.p);
        dbatch_.pos = d;
        dbatch_.seq = d + cap_tok_;
        dbatch_.block_table = d + kBatchHeadWords * size_t(cap_tok_);
        dbatch_.max_blocks = bt_stride_;
        n_tok_ = n_tok;
        n_seq_ = b.n_seq;
        max_len_ = max_pos + 1;
        invariant_ = b.batch_invariant;
        fast_attn_ = b.fast_attention;
        uint64_t sig = mix(mix(uint64_t(n_tok), uint64_t(invariant_)), uint64_t(fast_attn_));
        for (int k = 0; k < kNumTileLens; ++k) sig = mix(sig, uint64_t(n_tiles_[k]));
        sig = mix(sig, uint64_t(pow2_ceil((max_len_ + kKeysPerSplit - 1) / kKeysPerSplit)));
        batch_sig_ = sig;
    }

    // ---- primitives: each launches its kernels at once ----
    void matmul(const Weight& w, const float* x, int32_t n_tok, float* y) override {
        issue_uploads();
        const Weight* ws[1] = {&w};
        project(ws, &y, 1, x, n_tok, false);
    }
    // One q8_1 quantization of x for all weights, and one GEMV launch per run of weights of one type.
    void matmul_many(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok) override {
        if (!fuse_on_) return Backend::matmul_many(ws, ys, count, x, n_tok);
        issue_uploads();
        project(ws, ys, count, x, n_tok, false);
    }
    void rmsnorm(const float* x, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y) override {
        issue_uploads();
        cuda::rmsnorm(const_cast<float*>(x), nullptr, gamma, n_tok, dim, eps, y, nullptr, nullptr, stream_);
    }
    void head_rmsnorm(float* x, const float* gamma, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                      float eps) override {
        issue_uploads();
        cuda::head_rmsnorm(x, gamma, n_tok, n_heads, head_dim, eps, stream_);
    }
    void rope(float* x, int32_t n_tok, int32_t n_heads, const RopeParams& rope) override {
        issue_uploads();
        check_batch(n_tok, "rope");
        cuda::rope(x, dbatch_.pos, n_tok, n_heads, rope.head_dim, rope_table(rope), rope.neox, stream_);
    }
    void kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) override {
        issue_uploads();
        check_batch(n_tok, "kv_store");
        check_kv(kv, "kv_store");
        if (kv.k_type != kv.v_type) return store_mixed(kv, k, v, n_tok);
        if (kv.k_type == GGMLType::Q8_0) return store_q8(kv, k, v, n_tok);
        cuda::kv_store(static_cast<__half*>(kv.k), static_cast<__half*>(kv.v), kv.block_size, kv.n_head_kv * kv.head_dim,
                       k, v, n_tok, dbatch_, stream_);
    }
    void attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape, float* out) override {
        issue_uploads();
        attend(kv, q, n_tok, shape, out, false);
    }
    void gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out) override {
        issue_uploads();
        cuda::gated_act(act, gate, up, n, out, stream_);
    }
    void add(float* x, const float* y, int64_t n) override {
        issue_uploads();
        cuda::add(x, y, n, stream_);
    }
    void add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim) override {
        issue_uploads();
        cuda::add_bias(x, bias, n_tok, dim, stream_);
    }
    void argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids) override {
        issue_uploads();
        cuda::argmax_rows(x, n_rows, width, ids, stream_);
    }

    // ---- fused ops. Where a GEMV of a decode-sized batch reads the result of the kernel before
    // it, that kernel also writes the result as q8_1 blocks into the scratch (xq_, xds_) and the
    // GEMV reads them there: the handoff is explicit inside one op. ----

    // The residual add inside the norm kernel.
    void add_rmsnorm(float* x, const float* residual, const float* gamma, int32_t n_tok, int32_t dim, float eps,
                     float* y) override {
        if (!fuse_on_) return Backend::add_rmsnorm(x, residual, gamma, n_tok, dim, eps, y);
        issue_uploads();
        norm(x, residual, gamma, n_tok, dim, eps, y, false);
    }
    // The output head: the norm writes the q8_1 input of the GEMV.
    void norm_matmul(float* x, const float* residual, const float* gamma, float eps, const Weight& w, int32_t n_tok,
                     float* xn, float* y) override {
        if (!fuse_on_) return Backend::norm_matmul(x, residual, gamma, eps, w, n_tok, xn, y);
        issue_uploads();
        const Weight* ws[1] = {&w};
        const int32_t dim = int32_t(w.n_in);
        const bool dq = feeds_dq(ws, n_tok), q8 = !dq && feeds_q8(ws, 1, n_tok, dim);
        norm(x, residual, gamma, n_tok, dim, eps, xn, q8, dq);
        project(ws, &y, 1, xn, n_tok, q8, dq);
    }
    // Norm (+ residual add, + q8_1 output); Q, K, V in one GEMV launch. A plain block (no biases,
    // no q/k norms) with f16 caches and normal rope has the GEMV rotate q and k and store k and v
    // as it writes its rows where gemv_takes_rope_store; otherwise one kernel ropes q and k and
    // stores f16 k and v (a q8_0 cache is stored by its own kernel after it; with one f16 and one
    // q8_0 cache, each is), after the biases and the per-head norms.
    void attn_in(const AttnInWeights& w, float* x, const float* residual, int32_t n_tok, KVLayer& kv,
                 const BlockBuffers& b) override {
        if (!fuse_on_) return Backend::attn_in(w, x, residual, n_tok, kv, b);
        issue_uploads();
        check_batch(n_tok, "attn_in");
        check_kv(kv, "attn_in");
        if (!w.rope) fail("cuda attn_in: no rope parameters");
        const RopeParams& rp = *w.rope;
        if (w.head_dim != kv.head_dim || w.n_head_kv != kv.n_head_kv || rp.head_dim != w.head_dim)
            fail("cuda attn_in: ", w.n_head_kv, " kv heads of ", w.head_dim, " (rope over ", rp.head_dim,
                 ") do not match the KV layer (", kv.n_head_kv, " of ", kv.head_dim, ")");
        const int32_t dim = int32_t(w.wq->n_in);
        const Weight* ws[3] = {w.wq, w.wk, w.wv};
        float* ys[3] = {b.q, b.k, b.v};
        const bool dq = feeds_dq(ws, n_tok), q8 = !dq && feeds_q8(ws, 3, n_tok, dim);
        norm(x, residual, w.norm, n_tok, dim, w.eps, b.xn, q8, dq);
        const float2* table = rope_table(rp);
        const bool f16_cache = kv.k_type == GGMLType::F16 && kv.v_type == GGMLType::F16;
        const bool plain = !w.bq && !w.bk && !w.bv && !w.q_norm && !w.k_norm;
        // (The engine's decode steps of several sequences take gemm_dq where it reads these weights:
        // one weight read for all tokens beats the GEMV's per-token work.)
        if (plain && f16_cache && !rp.neox && n_tok <= kMaxGemvTokens && !invariant_ && !takes_gemm_dq(*w.wq, n_tok)) {
            const cuda::DeviceWeight dq = device_weight(*w.wq), dk = device_weight(*w.wk), dv = device_weight(*w.wv);
            if (cuda::gemv_takes_rope_store(dq, dk, dv, kv.head_dim)) {
                const cuda::DeviceWeight* pw[3] = {&dq, &dk, &dv};
                const cuda::QkvRopeStore e{table, static_cast<__half*>(kv.k), static_cast<__half*>(kv.v), kv.block_size,
                                           kv.head_dim, dbatch_};
                cuda::gemv_rope_store(pw, ys, b.xn, static_cast<const int8_t*>(xq_.p), static_cast<const float2*>(xds_.p),
                                      n_tok, e, stream_);
                return;
            }
        }
        project(ws, ys, 3, b.xn, n_tok, q8, dq);
        const int32_t qw = w.n_head * w.head_dim, kw = w.n_head_kv * w.head_dim;
        if (w.bq) cuda::add_bias(b.q, w.bq, n_tok, qw, stream_);
        if (w.bk) cuda::add_bias(b.k, w.bk, n_tok, kw, stream_);
        if (w.bv) cuda::add_bias(b.v, w.bv, n_tok, kw, stream_);
        if (w.q_norm) cuda::head_rmsnorm(b.q, w.q_norm, n_tok, w.n_head, w.head_dim, w.eps, stream_);
        if (w.k_norm) cuda::head_rmsnorm(b.k, w.k_norm, n_tok, w.n_head_kv, w.head_dim, w.eps, stream_);
        // An early start only for the f16 decode kernel, which streams the older keys while this
        // kernel runs (before the short-context kernel an early start costs time).
        const bool early = decode_mma_attention(kv, n_tok) || short_attention(kv, n_tok);
        cuda::rope_kv_store(b.q, w.n_head, b.k, b.v, kv.n_head_kv, kv.head_dim, table, rp.neox,
                            f16_cache ? static_cast<__half*>(kv.k) : nullptr, f16_cache ? static_cast<__half*>(kv.v) : nullptr,
                            kv.block_size, n_tok, dbatch_, early, stream_);
        if (f16_cache) return;
        if (kv.k_type == kv.v_type) store_q8(kv, b.k, b.v, n_tok);
        else store_mixed(kv, b.k, b.v, n_tok);
    }
    // The attention kernels that can write their output as the q8_1 input of the O projection's
    // GEMV do.
    void attn_out(const KVLayer& kv, const AttentionShape& shape, const Weight& wo, int32_t n_tok, const BlockBuffers& b,
                  float* out) override {
        if (!fuse_on_) return Backend::attn_out(kv, shape, wo, n_tok, b, out);
        issue_uploads();
        const Weight* ws[1] = {&wo};
        const int64_t width = int64_t(shape.n_head) * shape.head_dim;
        if (wo.n_in != width) fail("cuda attn_out: the O projection reads ", wo.n_in, " values, attention writes ", width);
        const bool q8 = attend(kv, b.q, n_tok, shape, b.att, shape.head_dim % 32 == 0 && feeds_q8(ws, 1, n_tok, width));
        project(ws, &out, 1, b.att, n_tok, q8);
    }
    // Norm (+ residual add, + q8_1 output); gate and up in one GEMV launch; the gated activation
    // writing the q8_1 input of the down projection's GEMV. Float weights of decode batches with
    // SiLU: gate, up and the activation are one GEMV (gemv_swiglu).
    void ffn(const FfnWeights& w, float* x, const float* residual, int32_t n_tok, const BlockBuffers& b,
             float* out) override {
        if (!fuse_on_) return Backend::ffn(w, x, residual, n_tok, b, out);
        issue_uploads();
        const int32_t dim = int32_t(w.gate->n_in);
        const int64_t n_ff = w.gate->n_out, n = int64_t(n_tok) * n_ff;
        if (w.up->n_in != dim || w.up->n_out != n_ff || w.down->n_in != n_ff)
            fail("cuda ffn: gate ", w.gate->n_out, "x", w.gate->n_in, ", up ", w.up->n_out, "x", w.up->n_in, " and down ",
                 w.down->n_out, "x", w.down->n_in, " do not chain");
        const Weight* gu[2] = {w.gate, w.up};
        const Weight* dn[1] = {w.down};
        if (w.act == Activation::SiLU && n_tok <= kMaxGemvTokens && w.gate->type == w.up->type &&
            cuda::gemv_swiglu_supported(w.gate->type) && !invariant_) {
            norm(x, residual, w.norm, n_tok, dim, w.eps, b.xn, false);
            cuda::gemv_swiglu(device_weight(*w.gate), device_weight(*w.up), b.gate, b.xn, n_tok, stream_);
            project(dn, &out, 1, b.gate, n_tok, false);
            return;
        }
        const bool dq_in = feeds_dq(gu, n_tok), q8_in = !dq_in && feeds_q8(gu, 2, n_tok, dim);
        norm(x, residual, w.norm, n_tok, dim, w.eps, b.xn, q8_in, dq_in);
        float* ys[2] = {b.gate, b.up};
        project(gu, ys, 2, b.xn, n_tok, q8_in, dq_in);
        if (feeds_dq(dn, n_tok) && n % 32 == 0) {
            cuda::gated_act_dq(w.act, b.gate, b.up, n, dq_scratch(n), stream_);
            project(dn, &out, 1, b.gate, n_tok, false, true);   // (b.gate itself is not written)
            return;
        }
        const bool q8_mid = feeds_q8(dn, 1, n_tok, n_ff);
        if (q8_mid) {
            const Q8 q = q8_scratch(n);
            cuda::gated_act_q8(w.act, b.gate, b.up, n, b.gate, q.q, q.ds, stream_);
        } else {
            cuda::gated_act(w.act, b.gate, b.up, n, b.gate, stream_);
        }
        project(dn, &out, 1, b.gate, n_tok, q8_mid);
    }

    std::unique_ptr<WeightStream> open_stream(const StreamSetup& setup) override {
        issue_uploads();
        return open_weight_stream(device_, stream_, [this] { issue_uploads(); }, setup);
    }

    // Decode-step graphs: a step is keyed by the caller's key, the batch shape and the
    // attention split; its first run goes eagerly (sizing every scratch buffer), its second is
    // captured, later ones replay the graph.
    // The step's pending uploads (batch mirror, first hidden state) are part of the key: a
    // recorded step holds them as its first nodes, reading the same pinned staging each replay.
    bool step_begin(uint64_t key) override {
        if (capturing_) abort_capture();
        if (!graphs_on_ || n_tok_ <= 0 || !(n_tok_ <= kMaxGemvTokens || decode_batch())) return false;
        uint64_t full = mix(mix(key, batch_sig_), graph_gen_);
        for (int i = 0; i < uploads_.n; ++i)
            full = mix(mix(mix(full, reinterpret_cast<uintptr_t>(uploads_.dst[i])), reinterpret_cast<uintptr_t>(uploads_.src[i])),
                       uploads_.bytes[i]);
        auto it = graphs_.find(full);
        if (graph_log_)
            std::fprintf(stderr, "ember cuda graph: key %016llx gen %llu n_tok %d: %s\n", (unsigned long long)full,
                         (unsigned long long)graph_gen_, n_tok_,
                         it != graphs_.end() ? "replay" : seen_.count(full) ? "capture" : "eager (first sight)");
        if (it != graphs_.end()) {
            uploads_.n = 0;
            launch_graph(it->second);
            return true;
        }
        if (!seen_.insert(full).second) {
            EMBER_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
            capturing_ = true;
            capture_key_ = full;
            capture_gen_ = graph_gen_;
            issue_uploads();
        }
        return false;
    }
    void step_end() override {
        issue_uploads();
        if (!capturing_) return;
        capturing_ = false;
        cudaGraph_t g = nullptr;
        EMBER_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
        if (capture_gen_ != graph_gen_) {   // a buffer moved during the step: run it, keep nothing
            cudaGraphExec_t once = nullptr;
            const cudaError_t e = cudaGraphInstantiate(&once, g, 0);
            cudaGraphDestroy(g);
            EMBER_CUDA_CHECK(e);
            launch_graph(once);
            EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
            cudaGraphExecDestroy(once);
            return;
        }
        cudaGraphExec_t exec = nullptr;
        const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
        cudaGraphDestroy(g);
        EMBER_CUDA_CHECK(e);
        graphs_[capture_key_] = exec;
        launch_graph(exec);
    }

private:
    // Which attention kernel a batch takes, asked by attention() and by the kernel before it.
    // The reference-order short-context kernel (f16 K/V, every position < kExactMaxLen):
    // Batch-invariant steps take it for any number of tokens (each token's result is its own).
    bool exact_attention(int32_t n_tok, int32_t head_dim) const {
        return (n_tok <= kMaxIntPromptTokens || invariant_) && max_len_ <= cuda::kExactMaxLen && exact_attn_on_ &&
               head_dim % 8 == 0;
    }
    // A decode step of up to kMaxIntPromptTokens sequences over a short f16 context that need not
    // keep the CPU's order of sums, where EMBER_CUDA_SHORT_ATTN=1 asks for it: the latency-built
    // kernel, which copies the older K/V rows before its PDL wait (so only batches whose tokens
    // each are the only one of their sequence: every older row is an earlier step's). Larger steps
    // are bound by their KV bytes, which attention_decode_mma streams faster. Opt-in: its float q
    // and probabilities (where Llama's kernel rounds them to f16) move the engine's default-mode
    // greedy text further from Llama's (docs/performance.md).
    bool short_attention(const KVLayer& kv, int32_t n_tok) const {
        return fast_attn_ && short_attn_on_ && !invariant_ && kv.k_type == GGMLType::F16 && kv.v_type == GGMLType::F16 &&
               (n_tok == 1 || (decode_step(n_tok) && n_tok <= kMaxIntPromptTokens)) &&
               max_len_ <= cuda::kShortMaxLen;
    }
    // A decode step of the engine: one token from each of up to kMaxGraphDecodeTokens sequences.
    // Such steps repeat with the same shape every token, so they are recorded as graphs, one per
    // batch size (and length bucket); other steps larger than a single-sequence decode run eagerly.
    bool decode_batch() const { return n_tok_ <= kMaxGraphDecodeTokens && n_seq_ == n_tok_ && n_tiles_[0] == n_tok_; }
    // An op over n_tok tokens that are the whole of such a step: each the only one of its sequence.
    bool decode_step(int32_t n_tok) const { return n_tok == n_tok_ && decode_batch(); }
    // Batches whose attention the decode kernels take (one query per sequence, each over its own
    // context): single-sequence decode sizes and the engine's decode steps.
    bool decode_sized(int32_t n_tok) const { return n_tok <= kMaxGemvTokens || decode_step(n_tok); }
    // The long-context decode kernels take power-of-two KV blocks of >= 4 tokens (the default is
    // 16): q heads per CTA for the q8_0 or the f16 one, 0 when they do not take the layer.
    int decode_heads(const KVLayer& kv, int32_t n_head, bool q8) const {
        const bool blocks = (kv.block_size & (kv.block_size - 1)) == 0 && kv.block_size >= 4;
        return blocks ? cuda::attention_decode_heads(n_head, kv.n_head_kv, kv.head_dim, q8) : 0;
    }
    // An f16 layer's attention for this batch runs attention_decode_mma (as attention() decides;
    // the head count passed to decode_heads sets only how many heads a CTA takes, not whether the
    // kernel takes the layer, so the layer's kv heads stand in for the q heads it does not know).
    bool decode_mma_attention(const KVLayer& kv, int32_t n_tok) const {
        return kv.k_type == GGMLType::F16 && kv.v_type == GGMLType::F16 && decode_sized(n_tok) && !invariant_ &&
               !exact_attention(n_tok, kv.head_dim) && decode_heads(kv, kv.n_head_kv, false) > 0;
    }

    // A run of consecutive weights of one type that one launch takes (a GEMV or a gemm_dq call).
    struct WeightRun {
        static constexpr int kMax = std::max(cuda::kMaxGemvBatch, cuda::kMaxGemmDqWeights);
        cuda::DeviceWeight dw[kMax];
        const cuda::DeviceWeight* pw[kMax];
        float* py[kMax];
        int n = 0;
    };
    // Fills r with ws[i], ws[i + 1], ... of ws[i]'s type while `takes` holds, up to `limit`;
    // advances i past them.
    template <class Takes>
    void take_run(WeightRun& r, const Weight* const* ws, float* const* ys, int& i, int count, int limit, Takes takes) const {
        const GGMLType type = ws[i]->type;
        for (r.n = 0; i < count && r.n < limit && ws[i]->type == type && takes(*ws[i]); ++i, ++r.n) {
            r.dw[r.n] = device_weight(*ws[i]);
            r.pw[r.n] = &r.dw[r.n];
            r.py[r.n] = ys[i];
        }
    }
    cuda::DeviceWeight device_weight(const Weight& w) const {
        return {w.type, static_cast<const uint8_t*>(w.data), packed_layout(w.type, w.n_in, w.n_out), w.n_in, w.n_out};
    }
    void check_kv(const KVLayer& kv, const char* op) const {
        for (GGMLType t : {kv.k_type, kv.v_type})
            if (t != GGMLType::F16 && t != GGMLType::Q8_0)
                fail("cuda ", op, ": the GPU keeps KV in f16 or q8_0, not in GGML type ", int(t));
    }
    // Whether the input of a projection by these weights should come with its q8_1 blocks: the
    // integer GEMV paths and the quantized GEMM (batches up to kMaxIntPromptTokens) of the
    // quantized types read them.
    bool feeds_q8(const Weight* const* ws, int count, int32_t n_tok, int64_t width) const {
        if (n_tok <= 0 || n_tok > kMaxIntPromptTokens || width % 32) return false;
        for (int i = 0; i < count; ++i)
            if (cuda::gemv_wants_q8(ws[i]->type)) return true;
        return false;
    }
    // Whether the input of a projection by these weights should come as f16 in gemm_dq's order:
    // the first weight takes gemm_dq (its run of weights of one format goes as one launch).
    bool feeds_dq(const Weight* const* ws, int32_t n_tok) const { return takes_gemm_dq(*ws[0], n_tok); }
    // xh_ sized for n values: where a kernel writes gemm_dq's f16 input for project(x_dq).
    __half* dq_scratch(int64_t n) {
        ensure(xh_, size_t(n) * 2);
        return static_cast<__half*>(xh_.p);
    }
    // y = rmsnorm(x += residual) * gamma; with q8, y also as q8_1 blocks in the scratch; with dq,
    // also as gemm_dq's f16 input in xh_.
    void norm(float* x, const float* residual, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y,
              bool q8, bool dq = false) {
        const Q8 q = q8 ? q8_scratch(int64_t(n_tok) * dim) : Q8{};
        cuda::rmsnorm(x, residual, gamma, n_tok, dim, eps, y, q.q, q.ds, stream_,
                      dq ? dq_scratch(int64_t(n_tok) * dim) : nullptr);
    }
    // The quantized GEMM (int8 tensor cores, each weight byte read from memory once a call) takes
    // batches of kMaxGemvTokens < n_tok <= kMaxGemmQ8Tokens of its formats, except rows the GEMV
    // sums in the CPU's order (those keep the CPU backend's bits). EMBER_CUDA_GEMM_Q8=0 keeps
    // every batch on the older paths (A/B comparisons).
    bool takes_gemm_q8(const Weight& w, int32_t n_tok) const {
        static_assert(cuda::kMaxGemmQ8Tokens <= kMaxIntPromptTokens, "feeds_q8 makes the GEMM's q8_1 blocks");
        static const bool on = env_flag("EMBER_CUDA_GEMM_Q8");
        return on && n_tok > kMaxGemvTokens && n_tok <= cuda::kMaxGemmQ8Tokens && cuda::gemm_q8_supported(w.type) &&
               !cuda::gemv_cpu_order(w.n_in);
    }
    // The f16 GEMM on weights dequantized in registers takes batches of kMaxGemvTokens < n_tok <=
    // kMaxGemmDqTokens of its formats and widths (before gemm_q8 and cuBLAS), except the batches up
    // to kMaxIntPromptTokens of rows the GEMV sums in the CPU's order. Batch-invariant steps never
    // reach it (project). EMBER_CUDA_GEMM_DQ=0 keeps every batch on the older paths (A/B comparisons).
    // The engine's decode steps of 2..kMaxGemvTokens sequences take it too: one weight read for
    // all of them instead of the GEMV's per-token work.
    bool takes_gemm_dq(const Weight& w, int32_t n_tok) const {
        static const bool on = env_flag("EMBER_CUDA_GEMM_DQ");
        const bool sized = n_tok > kMaxGemvTokens || (n_tok >= 2 && decode_step(n_tok));
        return on && !invariant_ && sized && n_tok <= cuda::kMaxGemmDqTokens &&
               cuda::gemm_dq_supported(w.type, w.n_in) && !(cuda::gemv_cpu_order(w.n_in) && n_tok <= kMaxIntPromptTokens);
    }
    // An engine decode step of more than three GEMV chunks, on weights of the 256-element
    // super-block formats (the K-quants: the Q6_K output head of most models): their GEMV is
    // compute-bound at 8 tokens (a Q6_K head chunk runs at ~0.4 TB/s), so one dequantized cuBLAS
    // GEMM, which reads the weight once for all tokens, costs less than a launch per chunk.
    bool many_chunks_of_superblocks(const Weight& w, int32_t n_tok) const {
        return !invariant_ && n_tok > 3 * kMaxGemvTokens && decode_step(n_tok) &&
               cuda::block_info(w.type).block_elems == 256;
    }
    // ys[i] = x ws[i]^T; x_q8: the scratch already holds x as q8_1 blocks (the kernel before
    // wrote them), else they are made here where a GEMV or the quantized GEMM reads them; x_dq:
    // xh_ already holds x as gemm_dq's f16 input (ws[0] takes gemm_dq). Decode
    // batches: one GEMV launch per run of up to kMaxGemvBatch consecutive weights of one type;
    // batch-invariant steps of any size: the GEMV in chunks of kMaxGemvTokens tokens (a token's sums
    // do not depend on the rest of the batch); larger batches: gemm_dq where takes_gemm_dq (x
    // converted to f16 once for all its weights), else the quantized GEMM where takes_gemm_q8, else
    // up to kMaxIntPromptTokens the integer GEMV in chunks (the CPU's rounding); longer ones and
    // float weights of prompts: cuBLAS.
    void project(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok, bool x_q8,
                 bool x_dq = false) {
        if (n_tok <= 0 || count <= 0) return;
        const int64_t n_in = ws[0]->n_in;
        for (int i = 1; i < count; ++i)
            if (ws[i]->n_in != n_in) fail("cuda matmul: weights of one input read ", n_in, " and ", ws[i]->n_in, " values");
        bool any_dq = false;
        for (int i = 0; i < count; ++i) any_dq |= takes_gemm_dq(*ws[i], n_tok);
        const bool gemv_only = (n_tok <= kMaxGemvTokens && !any_dq) || invariant_;
        bool reads_q8 = false;   // some weight takes the GEMV or the quantized GEMM
        for (int i = 0; i < count; ++i)
            reads_q8 |= cuda::gemv_wants_q8(ws[i]->type) &&
                        (gemv_only || (n_tok <= kMaxIntPromptTokens && !takes_gemm_dq(*ws[i], n_tok)));
        if (!x_q8 && reads_q8 && n_in % 32 == 0) {
            const Q8 q = q8_scratch(int64_t(n_tok) * n_in);
            quantize_q8_1(x, q.q, q.ds, n_tok, n_in, stream_);
        }
        const auto* xq = static_cast<const int8_t*>(xq_.p);
        const auto* xds = static_cast<const float2*>(xds_.p);
        if (n_tok <= kMaxGemvTokens && gemv_only) {
            for (int i = 0; i < count;) {
                WeightRun r;
                take_run(r, ws, ys, i, count, kMaxGemvBatch, [](const Weight&) { return true; });
                gemv(r.pw, r.py, r.n, x, xq, xds, n_tok, stream_);
            }
            return;
        }
        auto gemv_chunks = [&](const Weight& w, float* y) {
            const cuda::DeviceWeight dw = device_weight(w);
            const cuda::DeviceWeight* pw[1] = {&dw};
            for (int32_t t0 = 0; t0 < n_tok; t0 += kMaxGemvTokens) {
                float* py[1] = {y + int64_t(t0) * w.n_out};
                gemv(pw, py, 1, x + int64_t(t0) * n_in, xq + int64_t(t0) * n_in, xds + int64_t(t0) * (n_in / 32),
                     std::min<int32_t>(kMaxGemvTokens, n_tok - t0), stream_);
            }
        };
        bool xh_dq = x_dq;   // xh_ holds x in gemm_dq's order
        for (int i = 0; i < count;) {
            const Weight& w = *ws[i];
            if (gemv_only) {
                gemv_chunks(w, ys[i++]);
                continue;
            }
            if (takes_gemm_dq(w, n_tok)) {
                if (!xh_dq) {
                    ensure(xh_, size_t(n_tok) * size_t(n_in) * 2);
                    cuda::gemm_dq_input(x, static_cast<__half*>(xh_.p), n_tok, n_in, stream_);
                    xh_dq = true;
                }
                // The run of weights of this format that take it goes as one launch.
                WeightRun r;
                take_run(r, ws, ys, i, count, cuda::kMaxGemmDqWeights,
                         [&](const Weight& v) { return takes_gemm_dq(v, n_tok); });
                cuda::gemm_dq(r.pw, r.py, r.n, static_cast<const __half*>(xh_.p), n_tok, stream_);
                continue;
            }
            if (takes_gemm_q8(w, n_tok)) {
                cuda::gemm_q8(device_weight(w), ys[i++], xq, xds, n_tok, stream_);
                continue;
            }
            if (n_tok > kMaxIntPromptTokens || (!cuda::gemv_wants_q8(w.type) && n_tok > kMaxGemvTokens) ||
                many_chunks_of_superblocks(w, n_tok)) {
                gemm(w, x, n_tok, ys[i++]);
                xh_dq = false;   // gemm() converts x into xh_ in the natural order
                continue;
            }
            gemv_chunks(w, ys[i++]);
        }
    }
    // Prompt batches: tensor cores through cuBLAS, y^T [n_out x n_tok] = W [n_out x n_in] x^T
    // (column-major: A = W^T with lda n_in, B = x^T with ldb n_in, C ldc n_out).
    void gemm(const Weight& w, const float* x, int32_t n_tok, float* y) {
        const float one = 1.f, zero = 0.f;
        const void* A = w.data;
        const void* B = x;
        cudaDataType ta = CUDA_R_32F, tb = CUDA_R_32F;
        const size_t nx = size_t(n_tok) * size_t(w.n_in);
        if (w.type == GGMLType::F32) {
            // float weights stay float (no tensor-core rounding of small F32 tensors)
        } else if (w.type == GGMLType::BF16) {
            ensure(xh_, nx * 2);
            convert_to_bf16(x, static_cast<__nv_bfloat16*>(xh_.p), int64_t(nx), stream_);
            ta = tb = CUDA_R_16BF;
            B = xh_.p;
        } else {
            ensure(xh_, nx * 2);
            convert_to_f16(x, static_cast<__half*>(xh_.p), int64_t(nx), stream_);
            ta = tb = CUDA_R_16F;
            B = xh_.p;
            if (w.type != GGMLType::F16) {
                ensure(wh_, size_t(w.n_out) * size_t(w.n_in) * 2);
                dequantize_f16(device_weight(w), static_cast<__half*>(wh_.p), stream_);
                A = wh_.p;
            }
        }
        EMBER_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(w.n_out), n_tok, int(w.n_in), &one, A, ta,
                                        int(w.n_in), B, tb, int(w.n_in), &zero, y, CUDA_R_32F, int(w.n_out),
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    // The rotations of `params` for the batch's positions. A first use allocates the table
    // (set_batch grows it later), which moves a buffer as growing does.
    const float2* rope_table(const RopeParams& params) {
        bool moved = false;
        const float2* t = ropes_.get(params, max_len_, stream_, moved);
        if (moved) invalidate_graphs();
        return t;
    }
    // Keys one query tile reads at most: the context, or with a sliding window the window and
    // the part of a key tile below it. Sets the split counts; a function of the batch signature's
    // length bucket and the window, so recorded graphs stay valid.
    int32_t key_span(int32_t window) const {
        return window > 0 ? std::min(max_len_, window + kKeysPerSplit) : max_len_;
    }
    // The attention of q over kv into out. want_q8: the kernels that can also write out as q8_1
    // blocks into the scratch do; returns whether they did.
    bool attend(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape, float* out, bool want_q8) {
        check_batch(n_tok, "attention");
        check_kv(kv, "attention");
        if (shape.n_head_kv != kv.n_head_kv || shape.head_dim != kv.head_dim)
            fail("cuda attention: shape (", shape.n_head_kv, " kv heads of ", shape.head_dim, ") does not match the KV layer (",
                 kv.n_head_kv, " of ", kv.head_dim, ")");
        if (shape.window < 0) fail("cuda attention: negative window ", shape.window);
        cuda::AttentionArgs a{};
        a.k_cache = static_cast<const __half*>(kv.k);
        a.v_cache = static_cast<const __half*>(kv.v);
        if (kv.k_type == GGMLType::Q8_0 && kv.v_type == GGMLType::Q8_0) {
            // Decode reads the q8_0 blocks directly; other batches read an f16 copy of the blocks
            // they use (their work per KV byte is large, so the copy costs little).
            a.kv_q8 = !invariant_ && decode_sized(n_tok) && decode_heads(kv, shape.n_head, true) > 0 &&
                      kv_block_bytes(GGMLType::Q8_0, kv.block_size, int64_t(kv.n_head_kv) * kv.head_dim) % 16 == 0;
            if (!a.kv_q8) expand_q8(kv, a);
        } else if (kv.k_type == GGMLType::Q8_0 || kv.v_type == GGMLType::Q8_0) {
            // One q8_0 and one f16 cache: the f16 kernels, over an f16 copy of the q8_0 one.
            expand_q8(kv, a);
        }
        a.block_size = kv.block_size;
        a.cache_rows = int64_t(kv.n_blocks) * kv.block_size;
        a.n_head = shape.n_head;
        a.n_head_kv = shape.n_head_kv;
        a.head_dim = shape.head_dim;
        a.scale = shape.scale;
        a.window = shape.window;
        a.q = q;
        a.out = out;
        a.n_tok = n_tok;
        const int n_rep = shape.n_head_kv > 0 ? shape.n_head / shape.n_head_kv : 1;
        a.heads_per_cta = std::min(n_rep, 8);
        const int want_splits = pow2_ceil((key_span(shape.window) + kKeysPerSplit - 1) / kKeysPerSplit);
        // The exact and decode kernels write q8_1 blocks along with their output.
        auto with_q8_out = [&](auto&& launch) {
            if (want_q8) {
                const Q8 q8 = q8_scratch(int64_t(n_tok) * shape.n_head * shape.head_dim);
                a.out_q = q8.q;
                a.out_ds = q8.ds;
            }
            launch();
            return want_q8;
        };
        if (!a.kv_q8 && short_attention(kv, n_tok)) {
            bool took = false;
            const bool q8 = with_q8_out([&] { took = cuda::attention_short(a, dbatch_, max_len_, stream_); });
            if (took) return q8;
            a.out_q = nullptr;
            a.out_ds = nullptr;
        }
        if (!a.kv_q8 && exact_attention(n_tok, shape.head_dim))
            return with_q8_out([&] {
                a.old_rows_ready = decode_step(n_tok);
                cuda::attention_exact(a, dbatch_, exact_cluster_on_, stream_);
            });
        if (invariant_) {   // one query per tile, one split: nothing depends on the rest of the batch
            a.tile_len = kTileLens[0];
            a.n_tiles = n_tiles_[0];
            a.tiles = tiles_for(0);
            a.n_split = 1;
            prepare_splits(a, size_t(a.n_tiles) * shape.n_head_kv * ((n_rep + a.heads_per_cta - 1) / a.heads_per_cta));
            cuda::attention(a, dbatch_, stream_);
            return false;
        }
        if (n_tok > kMaxIntPromptTokens && !decode_sized(n_tok)) {   // long prompts: tensor cores where the head dim allows
            a.tile_len = kMmaTileLen;
            a.n_tiles = n_tiles_[kNumTileLens - 1];
            a.tiles = tiles_for(kNumTileLens - 1);
            a.n_split = 1;
            if (cuda::attention_prefill_mma(a, dbatch_, stream_)) return false;
        }
        const int n_dec = decode_heads(kv, shape.n_head, a.kv_q8);
        if (decode_sized(n_tok) && n_dec > 0) {   // decode over a long context: pipelined tiles
            const int n_groups = (n_rep + n_dec - 1) / n_dec;
            const int base = n_tok * shape.n_head_kv * n_groups;
            const int target = a.kv_q8 ? kDecodeTargetCtas : kDecodeMmaTargetCtas;
            a.n_split = std::max(1, std::min(want_splits, pow2_floor(std::max(1, target / base))));
            prepare_splits(a, size_t(base));
            return with_q8_out([&] {
                if (a.kv_q8) cuda::attention_decode(a, dbatch_, stream_);
                else cuda::attention_decode_mma(a, dbatch_, stream_);
            });
        }
        // Prompts: share K/V among up to 8 queries.
        int k = 0;
        if (n_tok > kMaxGemvTokens) {
            const int tq = std::max(1, 8 / pow2_ceil(a.heads_per_cta));
            while (kTileLens[k] < tq) ++k;
        }
        a.tile_len = kTileLens[k];
        a.n_tiles = n_tiles_[k];
        a.tiles = tiles_for(k);
        const int n_hchunks = (n_rep + a.heads_per_cta - 1) / a.heads_per_cta;
        const int base = a.n_tiles * shape.n_head_kv * n_hchunks;
        a.n_split = std::max(1, std::min(want_splits, pow2_floor(std::max(1, kTargetAttnCtas / std::max(base, 1)))));
        prepare_splits(a, size_t(a.n_tiles) * shape.n_head_kv * n_hchunks);
        cuda::attention(a, dbatch_, stream_);
        return false;
    }

    // Pending uploads: host-to-device copies of a step's inputs from pinned staging (the batch
    // mirror, copy_from_host's small copies), issued by the next op or inside a step's capture.
    // A replayed step then costs the host one graph launch, not two more copy calls and an
    // event record. staging_done_ follows the last issued ones: set_batch waits on it before
    // rewriting the staging.
    void issue_uploads() {
        if (!uploads_.n) return;
        cuda::copy_from_pinned(uploads_, stream_);
        if (!capturing_) EMBER_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
        uploads_.n = 0;
    }
    void add_upload(void* dst, const void* src, size_t bytes) {
        uploads_.dst[uploads_.n] = dst;
        uploads_.src[uploads_.n] = src;
        uploads_.bytes[uploads_.n++] = bytes;
    }
    void launch_graph(cudaGraphExec_t g) {
        EMBER_CUDA_CHECK(cudaGraphLaunch(g, stream_));
        EMBER_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
    }
    // Room in pinned_in_ for a pending upload of `bytes`; null (copy directly) when it does not
    // fit, while capturing, or when the upload list is full.
    void* pinned_input(size_t bytes) {
        constexpr size_t kAlign = 256;
        if (bytes > kPinnedInBytes || capturing_ || uploads_.n == cuda::kMaxHostCopies) return nullptr;
        if (in_used_ + bytes > kPinnedInBytes) {   // full: wait until the issued copies have read it
            issue_uploads();
            EMBER_CUDA_CHECK(cudaEventSynchronize(staging_done_));
            in_used_ = 0;
        }
        if (!pinned_in_) pinned_in_ = alloc_host(kPinnedInBytes);
        void* p = static_cast<char*>(pinned_in_) + in_used_;
        in_used_ += (bytes + kAlign - 1) / kAlign * kAlign;
        return p;
    }
    bool is_pinned(const void* p, size_t bytes) const {
        const char* c = static_cast<const char*>(p);
        for (const HostBlock& h : host_blocks_)
            if (c >= static_cast<const char*>(h.p) && c + bytes <= static_cast<const char*>(h.p) + h.bytes) return true;
        return false;
    }

    void store_q8(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
        cuda::kv_store_q8(static_cast<uint8_t*>(kv.k), static_cast<uint8_t*>(kv.v), kv.block_size,
                          kv.n_head_kv * kv.head_dim, kv.head_dim, k, v, n_tok, dbatch_, stream_);
    }
    // A layer with one f16 and one q8_0 cache: each stored by the kernel of its type.
    void store_mixed(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
        const bool k_q8 = kv.k_type == GGMLType::Q8_0;
        const int32_t width = kv.n_head_kv * kv.head_dim;
        cuda::kv_store_q8(k_q8 ? static_cast<uint8_t*>(kv.k) : nullptr, k_q8 ? nullptr : static_cast<uint8_t*>(kv.v),
                          kv.block_size, width, kv.head_dim, k, v, n_tok, dbatch_, stream_);
        cuda::kv_store(k_q8 ? nullptr : static_cast<__half*>(kv.k), k_q8 ? static_cast<__half*>(kv.v) : nullptr,
                       kv.block_size, width, k, v, n_tok, dbatch_, stream_);
    }
    // The batch's blocks of the layer's q8_0 caches as f16 in kv_f16_ (one layer's worth, reused
    // by all); a.k_cache / a.v_cache point at the copies.
    void expand_q8(const KVLayer& kv, cuda::AttentionArgs& a) {
        const int64_t width = int64_t(kv.n_head_kv) * kv.head_dim, n = int64_t(kv.n_blocks) * kv.block_size * width;
        ensure(kv_f16_, size_t(n) * 2 * sizeof(__half));
        __half* kh = static_cast<__half*>(kv_f16_.p);
        const int32_t n_blk = std::min<int32_t>(bt_stride_, (max_len_ + kv.block_size - 1) / kv.block_size);
        const bool k_q8 = kv.k_type == GGMLType::Q8_0, v_q8 = kv.v_type == GGMLType::Q8_0;
        cuda::kv_expand_q8(k_q8 ? static_cast<const uint8_t*>(kv.k) : nullptr,
                           v_q8 ? static_cast<const uint8_t*>(kv.v) : nullptr, kh, kh + n, kv.block_size,
                           int32_t(width), kv.head_dim, kv.n_blocks, n_seq_, n_blk, dbatch_, stream_);
        if (k_q8) a.k_cache = kh;
        if (v_q8) a.v_cache = kh + n;
    }
    // Partial-result buffers and per-CTA-group counters of a split (flash-decoding) attention.
    void prepare_splits(cuda::AttentionArgs& a, size_t n_groups) {
        if (a.n_split <= 1) return;
        const size_t slots = size_t(a.n_split) * a.n_tok * a.n_head;
        ensure(part_acc_, slots * a.head_dim * 4);
        ensure(part_ml_, slots * sizeof(float2));
        a.part_acc = static_cast<float*>(part_acc_.p);
        a.part_ml = static_cast<float2*>(part_ml_.p);
        if (ensure(split_ctr_, n_groups * sizeof(int32_t)))   // counters start at zero, kernels reset them
            EMBER_CUDA_CHECK(cudaMemsetAsync(split_ctr_.p, 0, split_ctr_.cap, stream_));
        a.split_counter = static_cast<int32_t*>(split_ctr_.p);
    }
    // The q8_1 activation buffers (xq_, xds_), grown to hold `total` values.
    struct Q8 {
        int8_t* q = nullptr;
        float2* ds = nullptr;
    };
    Q8 q8_scratch(int64_t total) {
        ensure(xq_, size_t(total));
        ensure(xds_, size_t(total / 32) * sizeof(float2));
        return {static_cast<int8_t*>(xq_.p), static_cast<float2*>(xds_.p)};
    }
    struct Scratch {
        void* p = nullptr;
        size_t cap = 0;
    };
    static constexpr size_t kCublasWorkspace = size_t(32) << 20;

    // Grows s to hold bytes; true when it (re)allocated.
    bool ensure(Scratch& s, size_t bytes) {
        if (bytes <= s.cap) return false;
        if (capturing_) fail("cuda: scratch buffer must grow to ", bytes, " bytes inside a captured step");
        if (s.p) {
            EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
            EMBER_CUDA_CHECK(cudaFree(s.p));
            s.p = nullptr;
            s.cap = 0;
        }
        const size_t cap = std::max(bytes, s.cap * 3 / 2);
        s.p = alloc(cap);
        s.cap = cap;
        invalidate_graphs();
        return true;
    }
    void invalidate_graphs() {
        if (graph_log_) std::fprintf(stderr, "ember cuda graph: invalidated (gen %llu)\n", (unsigned long long)graph_gen_);
        ++graph_gen_;
        for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
        graphs_.clear();
        seen_.clear();
    }
    void abort_capture() {
        cudaGraph_t g = nullptr;
        cudaStreamEndCapture(stream_, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        capturing_ = false;
    }
    const cuda::AttnTile* tiles_for(int k) const {
        return reinterpret_cast<const cuda::AttnTile*>(dbatch_.pos + 2 * size_t(cap_tok_) + size_t(k) * 2 * cap_tok_);
    }
    void check_batch(int32_t n_tok, const char* op) const {
        if (n_tok != n_tok_) fail("cuda ", op, ": n_tok ", n_tok, " but set_batch gave ", n_tok_);
    }

    int device_;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    void* cublas_ws_ = nullptr;
    std::vector<void*> owned_;
    Scratch xq_, xds_, xh_, wh_, batch_dev_, part_acc_, part_ml_, split_ctr_, kv_f16_;

    // batch mirror
    void* staging_ = nullptr;
    size_t staging_cap_ = 0;
    cudaEvent_t staging_done_ = nullptr;
    static constexpr size_t kPinnedOutBytes = size_t(1) << 20;
    void* pinned_out_ = nullptr;   // copy_to_host's bounce buffer
    static constexpr size_t kPinnedInBytes = size_t(1) << 20;
    cuda::HostCopies uploads_{};
    void* pinned_in_ = nullptr;   // copy_from_host's pending small copies, from offset 0 each step
    size_t in_used_ = 0;
    struct HostBlock {
        void* p;
        size_t bytes;
    };
    std::vector<HostBlock> host_blocks_;   // from alloc_host
    int32_t cap_tok_ = 0, cap_seq_ = 0, bt_stride_ = 0;
    cuda::DeviceBatch dbatch_{};
    cuda::RopeTables ropes_;
    int32_t n_tok_ = 0, n_seq_ = 0, max_len_ = 0;
    int n_tiles_[kNumTileLens] = {};
    uint64_t batch_sig_ = 0;

    // graphs
    std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
    std::unordered_set<uint64_t> seen_;
    uint64_t graph_gen_ = 0, capture_key_ = 0, capture_gen_ = 0;
    bool capturing_ = false;
    bool graphs_on_ = true, fuse_on_ = true, exact_attn_on_ = true, exact_cluster_on_ = true, short_attn_on_ = false;
    bool graph_log_ = false;
    // The batch asks for kernels whose per-token results do not depend on the batch
    // (BatchInfo::batch_invariant): no decode-only fusions, the integer GEMV for every size,
    // attention one query per tile without key splits.
    bool invariant_ = false;
    // The batch lets short contexts take attention_short (BatchInfo::fast_attention).
    bool fast_attn_ = false;
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
    return std::make_unique<cuda::CudaBackend>(opts.device);
}

}  // namespace ember
