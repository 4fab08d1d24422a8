// KV of GPU blocks in host memory (offload_kqv=False, llama.cpp's -nkvo): the KV stays where the
// GPU's memory is not spent on it, and each block's ops run on the GPU around it. This backend
// wraps the GPU's: every op goes to the GPU except the ones that touch the KV, which run on a
// staging copy of the blocks they need (one layer's worth of device memory, shared by all
// layers): attn_in stages the blocks that receive the step's new rows, the GPU writes the rows
// there and the blocks go back to host memory; attention stages the rest of its sequences' blocks
// and runs the GPU's kernels. So the results are the GPU-KV results bit for bit, and a step moves
// its sequences' KV over PCIe once (docs/cuda.md has the measurements that chose this over
// attention on the CPU next to the KV).
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace ember {

class HostKVBackend final : public Backend {
public:
    // gpu: the device the blocks run on; geometry: one KV layer (the staging gets its size).
    // Throws OutOfMemory when the staging does not fit.
    HostKVBackend(Backend& gpu, const KVLayer& geometry);
    ~HostKVBackend() override;

    // Host memory for one layer's K or V: pinned where the GPU can pin it (full-speed copies),
    // else plain memory with one warning on stderr. Freed with this backend.
    void* alloc_kv(size_t bytes);

    const char* name() const override { return "host-kv"; }
    bool is_host() const override { return false; }
    void* alloc(size_t bytes) override { return gpu_.alloc(bytes); }
    void free(void* p) override { gpu_.free(p); }
    // Copies whose "device" side is this backend's host KV (a block's copy on write, the engine's
    // host tier) are host copies, made after the GPU's copies in flight.
    void copy_from_host(void* dst, const void* src, size_t bytes) override;
    void copy_to_host(void* dst, const void* src, size_t bytes) override;
    void synchronize() override { gpu_.synchronize(); }
    void copy(void* dst, const void* src, size_t bytes) override;
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
    void rope(float* x, int32_t n_tok, int32_t n_heads, const RopeParams& rope) override {
        gpu_.rope(x, n_tok, n_heads, rope);
    }
    void kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) override;
    void attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape,
                   float* out) override;
    void gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out) override {
        gpu_.gated_act(act, gate, up, n, out);
    }
    void add(float* x, const float* y, int64_t n) override { gpu_.add(x, y, n); }
    void add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim) override {
        gpu_.add_bias(x, bias, n_tok, dim);
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

private:
    // Blocks `ids` (sorted, unique) of `from` into `to`, K and V, runs of consecutive ids as one copy.
    void copy_blocks(const KVLayer& from, KVLayer& to, const std::vector<int32_t>& ids, bool to_gpu);
    KVLayer staged(const KVLayer& host) const;
    bool in_host_kv(const void* p) const;
    void host_copy(void* dst, const void* src, size_t bytes);

    Backend& gpu_;
    KVLayer geometry_;
    void* staging_ = nullptr;                  // one layer's K then V, on the GPU
    std::vector<int32_t> written_;             // blocks the step's new rows land in
    std::vector<int32_t> read_;                // blocks the step's attention reads
    std::vector<void*> pinned_, plain_;        // alloc_kv's allocations
    std::vector<std::pair<const uint8_t*, size_t>> kv_ranges_;   // all of them, for in_host_kv
};

}  // namespace ember
