// KV in host memory (offload_kqv=False, llama.cpp's -nkvo / --no-kv-offload): the KV of the
// GPU's layers lives in host memory and the GPU's ops run around it. Not to be confused with the
// engine's host tier (src/kv/host_tier.h: a second pool that preempted sequences are swapped to
// and evicted prefix blocks are kept in, kv_host_mb) or the streamed weights
// (src/model/streamed_weights.h: CPU layers run on the GPU for large batches).
//
// The KV stays where the GPU's memory is not spent on it. This backend wraps the GPU's: every op
// goes to the GPU except the ones that touch the KV, which run on a staging copy of the blocks they
// need (one layer's worth of device memory, shared by all layers): attn_in stages the blocks that
// receive the step's new rows, the GPU writes the rows there and the blocks go back to host memory;
// attention stages the rest of its sequences' blocks and runs the GPU's kernels. So the results are
// the GPU-KV results bit for bit, and a step moves its sequences' KV over PCIe once (docs/cuda.md
// has the measurements that chose this over attention on the CPU next to the KV).
// A GPU block cache (gpu_cache_bytes, over all layers) keeps copies of the blocks steps keep
// reading, so those need not cross PCIe again: at depth the link, not the GPU, sets the speed. A
// step whose blocks all have a slot runs on the cache itself (its block table renumbered to the
// slots), with no staging copies; otherwise the cached blocks are copied into the staging on the
// GPU. The host copy stays the one that counts (every new row is written back), so a cached block
// can be dropped at any time; a host-side write into a block (the host tier's copies) drops its
// cached copies.
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace ember {

class KVInHostMemory final : public Backend {
public:
    // gpu: the device the blocks run on; geometry: one KV layer (the staging gets its size);
    // n_layers: the layers whose KV this backend holds; gpu_cache_bytes: the block cache's device
    // memory, shrunk (with a warning) where the GPU has less. Throws OutOfMemory when the staging
    // does not fit.
    KVInHostMemory(Backend& gpu, const KVLayer& geometry, int32_t n_layers, size_t gpu_cache_bytes);
    ~KVInHostMemory() override;

    // Host memory for one layer's K and V (kv.k, kv.v; geometry as the constructor's): pinned where
    // the GPU can pin it (full-speed copies), else plain memory with one warning on stderr. Freed
    // with this backend. At most n_layers calls.
    void alloc_layer(KVLayer& kv);
    int32_t cache_blocks() const { return n_slots_; }   // blocks the GPU cache holds per layer

    const char* name() const override { return "kv-in-host-memory"; }
    bool is_host() const override { return false; }
    void* alloc(size_t bytes) override { return gpu_.alloc(bytes); }
    void free(void* p) override { gpu_.free(p); }
    // Copies whose "device" side is this backend's host memory (the host tier's swaps and
    // evictions) are host copies, made after the GPU's copies in flight.
    void copy_from_host(void* dst, const void* src, size_t bytes) override;
    void copy_to_host(void* dst, const void* src, size_t bytes) override;
    void synchronize() override { gpu_.synchronize(); }
    void* alloc_host(size_t bytes) override { return gpu_.alloc_host(bytes); }
    void free_host(void* p) override { gpu_.free_host(p); }
    Weight prepare_weight(const GGUFTensor& t) override { return gpu_.prepare_weight(t); }
    const float* prepare_vector(const GGUFTensor& t) override { return gpu_.prepare_vector(t); }

    void set_batch(const BatchInfo& batch) override;

    void matmul(const Weight& w, const float* x, int32_t n_tok, float* y) override { gpu_.matmul(w, x, n_tok, y); }
    void matmul_many(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok) override {
        gpu_.matmul_many(ws, ys, count, x, n_tok);
    }
    void rmsnorm(const float* x, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y) override {
        gpu_.rmsnorm(x, gamma, n_tok, dim, eps, y);
    }
    void head_rmsnorm(float* x, const float* gamma, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                      float eps) override {
        gpu_.head_rmsnorm(x, gamma, n_tok, n_heads, head_dim, eps);
    }
    void rmsnorm_grouped(const float* x, const float* gamma, int32_t n_rows, int64_t width, int32_t n_groups, float eps,
                         float* y) override {
        gpu_.rmsnorm_grouped(x, gamma, n_rows, width, n_groups, eps, y);
    }
    void rope(float* x, int32_t n_tok, int32_t n_heads, const RopeParams& rope) override {
        gpu_.rope(x, n_tok, n_heads, rope);
    }
    void attn_temperature(float* q, int32_t n_tok, int64_t width, const RopeParams& rope) override {
        gpu_.attn_temperature(q, n_tok, width, rope);
    }
    void kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) override;
    void attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape, float* out) override;
    void gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out) override {
        gpu_.gated_act(act, gate, up, n, out);
    }
    void add(float* x, const float* y, int64_t n) override { gpu_.add(x, y, n); }
    void add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim) override {
        gpu_.add_bias(x, bias, n_tok, dim);
    }
    void argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids) override {
        gpu_.argmax_rows(x, n_rows, width, ids);
    }
    void moe_route(const MoeWeights& w, const float* logits, int32_t n_tok, int32_t* ids, float* weights) override {
        gpu_.moe_route(w, logits, n_tok, ids, weights);
    }
    void gather_rows(const float* x, const int32_t* rows, int32_t n_rows, int64_t dim, float* y) override {
        gpu_.gather_rows(x, rows, n_rows, dim, y);
    }
    void scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* scale, int32_t n_rows,
                          int64_t dim) override {
        gpu_.scatter_add_rows(out, y, rows, scale, n_rows, dim);
    }
    void sigmoid(float* x, int64_t n) override { gpu_.sigmoid(x, n); }
    void mul(float* x, const float* y, int64_t n) override { gpu_.mul(x, y, n); }
    void softplus_gate(float* x, const float* bias, const float* scale, int32_t n_tok, int32_t dim) override {
        gpu_.softplus_gate(x, bias, scale, n_tok, dim);
    }
    void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                   int64_t n_rows) override {
        gpu_.copy_rows(dst, dst_stride, src, src_stride, width, n_rows);
    }
    void scale_softcap(float* x, int64_t n, float scale, float cap) override { gpu_.scale_softcap(x, n, scale, cap); }
    void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                          int32_t n_tok, const DeltaRuleShape& shape, float* state, float* out) override {
        gpu_.gated_delta_rule(q, k, v, g, beta, n_tok, shape, state, out);
    }
    void short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels, int32_t kernel,
                    bool silu, float* state, float* y) override {
        gpu_.short_conv(x, w, bias, n_tok, channels, kernel, silu, state, y);
    }
    void ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                  int32_t n_tok, const SsmShape& shape, float* state, float* y) override {
        gpu_.ssm_scan(xbc, dt, A, dt_bias, D, n_tok, shape, state, y);
    }
    void layernorm(const float* x, const float* gamma, const float* beta, int32_t n_tok, int32_t dim, float eps,
                   float* y) override {
        gpu_.layernorm(x, gamma, beta, n_tok, dim, eps, y);
    }
    void unary(UnaryOp f, float* x, int64_t n) override { gpu_.unary(f, x, n); }
    void encoder_attention(const float* q, const float* k, const float* v, int32_t n_tok, const AttentionShape& shape,
                           float* out) override {
        gpu_.encoder_attention(q, k, v, n_tok, shape, out);
    }
    void add_rmsnorm(float* x, const float* residual, const float* gamma, int32_t n_tok, int32_t dim, float eps,
                     float* y) override {
        gpu_.add_rmsnorm(x, residual, gamma, n_tok, dim, eps, y);
    }
    void norm_matmul(float* x, const float* residual, const float* gamma, float eps, const Weight& w, int32_t n_tok,
                     float* xn, float* y) override {
        gpu_.norm_matmul(x, residual, gamma, eps, w, n_tok, xn, y);
    }
    void attn_in(const AttnInWeights& w, float* x, const float* residual, int32_t n_tok, KVLayer& kv,
                 const BlockBuffers& b) override;
    void attn_out(const KVLayer& kv, const AttentionShape& shape, const Weight& wo, int32_t n_tok,
                  const BlockBuffers& b, float* out) override;
    void ffn(const FfnWeights& w, float* x, const float* residual, int32_t n_tok, const BlockBuffers& b,
             float* out) override {
        gpu_.ffn(w, x, residual, n_tok, b, out);
    }
    void moe_ffn(const MoeWeights& w, float* x, const float* residual, int32_t n_tok, const BlockBuffers& b,
                 float* out) override {
        gpu_.moe_ffn(w, x, residual, n_tok, b, out);
    }
    void moe(const MoeWeights& w, const float* xn, int32_t n_tok, const BlockBuffers& b, float* out) override {
        gpu_.moe(w, xn, n_tok, b, out);
    }

private:
    struct Layer {
        uint8_t* host[2];            // K, V: every block, in host memory
        uint8_t* cache[2];           // K, V: n_slots_ blocks on the GPU
        std::vector<int32_t> holds;  // per slot: the block whose rows it holds, -1: none yet
    };
    void* alloc_host_memory(size_t bytes);
    Layer& layer_of(const KVLayer& kv);
    // Blocks `ids` of the layer into the staging: from the GPU cache where it holds them, else
    // from host memory (then into the cache too where the step gave them a slot).
    void stage(Layer& layer, const KVLayer& staged, const std::vector<int32_t>& ids);
    // The step's new rows back: blocks `ids` of the staging to host memory, and to their slots.
    void write_back(Layer& layer, const KVLayer& staged, const std::vector<int32_t>& ids);
    // On a step run on the cache: the slots of blocks `ids` that do not hold them yet get them
    // from host memory; with to_host, the other way (the step's new rows back to host memory).
    void sync_slots(Layer& layer, const std::vector<int32_t>& ids, bool to_host);
    KVLayer staged(const KVLayer& host) const;
    KVLayer cached(const Layer& layer, const KVLayer& host) const;
    bool in_host_memory(const void* p) const;
    // A host-side write of [dst, dst + bytes): made after the GPU's copies in flight; the blocks
    // it touches lose their cached copies.
    void host_copy(void* dst, const void* src, size_t bytes);

    Backend& gpu_;
    KVLayer geometry_;
    size_t block_bytes_[2];                    // K, V bytes of one block of one layer
    void* staging_ = nullptr;                  // one layer's K then V, on the GPU
    std::vector<int32_t> written_;             // blocks the step's new rows land in
    std::vector<int32_t> read_;                // blocks the step's attention reads
    int32_t n_slots_ = 0;                      // the GPU cache's blocks per layer
    void* cache_ = nullptr;                    // every layer's slots, K then V
    std::vector<int32_t> slot_of_;             // per block: its slot this step, -1: not cached
    std::vector<int32_t> block_in_slot_;       // per slot: the block assigned to it, -1: free
    bool on_cache_ = false;                    // the step runs on the cache (every block has a slot)
    std::vector<Layer> layers_;
    std::vector<void*> pinned_, plain_;        // alloc_host_memory's allocations
};

}  // namespace ember
