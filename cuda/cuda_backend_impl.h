// The CUDA Backend's class (private to cuda/): its state and the members each cuda_backend_*.cpp
// defines (memory and batch mirror, graphs, matmul dispatch, attention dispatch, fused ops).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "ember/status.h"
#include "kernel_choice.h"
#include "kernels.h"
#include "rope_table.h"

#define EMBER_CUBLAS_CHECK(expr)                                                                     \
    do {                                                                                             \
        cublasStatus_t st_ = (expr);                                                                 \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                            \
            throw std::runtime_error(cat("cuBLAS error ", cublasGetStatusName(st_), " in ", #expr)); \
    } while (0)

namespace ember {
namespace cuda {

inline int pow2_ceil(int v) {
    int p = 1;
    while (p < v) p <<= 1;
    return p;
}

inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(const BackendOptions& opts);
    ~CudaBackend() override;

    const char* name() const override { return "cuda"; }
    bool is_host() const override { return false; }

    // memory (cuda_backend_memory.cpp)
    void* alloc(size_t bytes) override;
    void free(void* p) override;
    void copy_from_host(void* dst, const void* src, size_t bytes) override;
    void copy_to_host(void* dst, const void* src, size_t bytes) override;
    void copy_to_host_async(void* dst, const void* src, size_t bytes) override;
    void copy(void* dst, const void* src, size_t bytes) override;
    void synchronize() override;
    void* alloc_host(size_t bytes) override;
    void free_host(void* p) override;
    size_t free_memory() override;
    Weight prepare_weight(const GGUFTensor& t) override;
    const float* prepare_vector(const GGUFTensor& t) override;
    void set_batch(const BatchInfo& b) override;
    std::unique_ptr<WeightStream> open_stream(const StreamSetup& setup) override;

    // primitives, each launching its kernels at once (cuda_backend_ops.cpp, matmuls in
    // cuda_backend_matmul.cpp, attention in cuda_backend_attention.cpp)
    void matmul(const Weight& w, const float* x, int32_t n_tok, float* y) override;
    void matmul_many(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok) override;
    void rmsnorm(const float* x, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y) override;
    void head_rmsnorm(float* x, const float* gamma, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                      float eps) override;
    void rmsnorm_grouped(const float* x, const float* gamma, int32_t n_rows, int64_t width, int32_t n_groups, float eps,
                         float* y) override;
    void rope(float* x, int32_t n_tok, int32_t n_heads, const RopeParams& rope) override;
    void attn_temperature(float* q, int32_t n_tok, int64_t width, const RopeParams& rope) override;
    void kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) override;
    void attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape, float* out) override;
    void gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out) override;
    void add(float* x, const float* y, int64_t n) override;
    void add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim) override;
    void scale_softcap(float* x, int64_t n, float scale, float cap) override;
    void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                          int32_t n_tok, const DeltaRuleShape& shape, float* state, float* out) override;
    void short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels, int32_t kernel,
                    bool silu, float* state, float* y) override;
    void ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                  int32_t n_tok, const SsmShape& shape, float* state, float* y) override;
    void argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids) override;
    // the mixture's primitives and fused ops (cuda_backend_moe.cpp)
    void moe_route(const MoeWeights& w, const float* logits, int32_t n_tok, int32_t* ids, float* weights) override;
    void gather_rows(const float* x, const int32_t* rows, int32_t n_rows, int64_t dim, float* y) override;
    void scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* scale, int32_t n_rows,
                          int64_t dim) override;
    void sigmoid(float* x, int64_t n) override;
    void mul(float* x, const float* y, int64_t n) override;
    void softplus_gate(float* x, const float* bias, const float* scale, int32_t n_tok, int32_t dim) override;
    void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                   int64_t n_rows) override;
    // the encoders' ops (cuda_backend_encoder.cpp)
    void layernorm(const float* x, const float* gamma, const float* beta, int32_t n_tok, int32_t dim, float eps,
                   float* y) override;
    void unary(UnaryOp f, float* x, int64_t n) override;
    void encoder_attention(const float* q, const float* k, const float* v, int32_t n_tok, const AttentionShape& shape,
                           float* out) override;
    void moe_ffn(const MoeWeights& w, float* x, const float* residual, int32_t n_tok, const BlockBuffers& b,
                 float* out) override;
    void moe(const MoeWeights& w, const float* xn, int32_t n_tok, const BlockBuffers& b, float* out) override;

    // fused ops (cuda_backend_ops.cpp)
    void add_rmsnorm(float* x, const float* residual, const float* gamma, int32_t n_tok, int32_t dim, float eps,
                     float* y) override;
    void norm_matmul(float* x, const float* residual, const float* gamma, float eps, const Weight& w, int32_t n_tok,
                     float* xn, float* y) override;
    void attn_in(const AttnInWeights& w, float* x, const float* residual, int32_t n_tok, KVLayer& kv,
                 const BlockBuffers& b) override;
    void attn_out(const KVLayer& kv, const AttentionShape& shape, const Weight& wo, int32_t n_tok,
                  const BlockBuffers& b, float* out) override;
    void ffn(const FfnWeights& w, float* x, const float* residual, int32_t n_tok, const BlockBuffers& b,
             float* out) override;

    // decode-step graphs (cuda_backend_graphs.cpp)
    bool step_begin(uint64_t key) override;
    void step_end() override;
    void step_abort() override;

private:
    struct Scratch {
        void* p = nullptr;
        size_t cap = 0;
    };
    // The q8_1 activation buffers (xq_, xds_).
    struct Q8 {
        int8_t* q = nullptr;
        float2* ds = nullptr;
    };
    struct HostBlock {
        void* p;
        size_t bytes;
    };
    // A run of consecutive weights of one type that one launch takes (a GEMV or a gemm_dq call).
    struct WeightRun {
        static constexpr int kMax = std::max(kMaxGemvBatch, kMaxGemmDqWeights);
        DeviceWeight dw[kMax];
        const DeviceWeight* pw[kMax];
        float* py[kMax];
        int n = 0;
    };
    static constexpr size_t kCublasWorkspace = size_t(32) << 20;
    static constexpr size_t kPinnedOutBytes = size_t(1) << 20;
    static constexpr size_t kPinnedInBytes = size_t(1) << 20;
    static constexpr int kBatchHeadWords = 2 + 2 * kNumTileLens; // int32 words per token slot before the block table

    // ---- the batch, as the kernel choices see it ----
    // A decode step of the engine: one token from each of up to kMaxGraphDecodeTokens sequences.
    // Such steps repeat with the same shape every token, so they are recorded as graphs, one per
    // batch size (and length bucket); other steps larger than a single-sequence decode run eagerly.
    bool decode_batch() const { return n_tok_ <= kMaxGraphDecodeTokens && n_seq_ == n_tok_ && n_tiles_[0] == n_tok_; }
    // An op over n_tok tokens that are the whole of such a step: each the only one of its sequence.
    bool decode_step(int32_t n_tok) const { return n_tok == n_tok_ && decode_batch(); }
    BatchFacts batch_facts(int32_t n_tok) const { return BatchFacts{n_tok, decode_step(n_tok), invariant_}; }
    MatmulQuery matmul_query(const Weight& w, int32_t n_tok) const;
    AttentionQuery attention_query(const KVLayer& kv, const AttentionShape& shape, int32_t n_tok) const;

    // ---- matmul dispatch (cuda_backend_matmul.cpp) ----
    bool takes_gemm_dq(const Weight& w, int32_t n_tok) const {
        return is_gemm_dq(choose_matmul(matmul_query(w, n_tok)));
    }
    bool feeds_q8(const Weight* const* ws, int count, int32_t n_tok, int64_t width) const;
    bool feeds_dq(const Weight* const* ws, int32_t n_tok) const { return takes_gemm_dq(*ws[0], n_tok); }
    template <class Takes>
    void take_run(WeightRun& r, const Weight* const* ws, float* const* ys, int& i, int count, int limit,
                  Takes takes) const;
    DeviceWeight device_weight(const Weight& w) const {
        return {w.type, static_cast<const uint8_t*>(w.data), packed_layout(w.type, w.n_in, w.n_out), w.n_in, w.n_out};
    }
    void norm(float* x, const float* residual, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y,
              bool q8, bool dq = false);
    void project(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok, bool x_q8,
                 bool x_dq = false);
    void gemm(const Weight& w, const float* x, int32_t n_tok, float* y);

    // ---- the mixture (cuda_backend_moe.cpp) ----
    struct MoeBuffers;
    MoeQuery moe_query(const MoeWeights& w, int32_t n_tok) const;
    MoeBuffers moe_buffers(const MoeWeights& w, int32_t n_tok, MoeKernel k);
    MoeExperts moe_experts(const Weight& w) const;
    void run_moe(const MoeWeights& w, const float* xn, int32_t n_tok, MoeKernel k, bool xn_q8, float* out);
    void shared_expert(const MoeWeights& w, const float* xn, int32_t n_tok, const MoeBuffers& m);

    // ---- attention dispatch (cuda_backend_attention.cpp) ----
    bool attend(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape, float* out,
                bool want_q8);
    void check_kv(const KVLayer& kv, const char* op) const;
    void store_q8(KVLayer& kv, const float* k, const float* v, int32_t n_tok);
    void store_mixed(KVLayer& kv, const float* k, const float* v, int32_t n_tok);
    void expand_to_f16(const KVLayer& kv, AttentionArgs& a);
    void prepare_splits(AttentionArgs& a, size_t n_groups);
    const float2* rope_table(const RopeParams& params);
    const AttnTile* tiles_for(int k) const {
        return reinterpret_cast<const AttnTile*>(dbatch_.pos + 2 * size_t(cap_tok_) + size_t(k) * 2 * cap_tok_);
    }

    // ---- memory and the batch mirror (cuda_backend_memory.cpp) ----
    void issue_uploads();
    void add_upload(void* dst, const void* src, size_t bytes);
    void* pinned_input(size_t bytes);
    bool is_pinned(const void* p, size_t bytes) const;
    bool ensure(Scratch& s, size_t bytes);
    Q8 q8_scratch(int64_t total);
    __half* dq_scratch(int64_t n);
    void check_batch(int32_t n_tok, const char* op) const {
        if (n_tok != n_tok_) fail("cuda ", op, ": n_tok ", n_tok, " but set_batch gave ", n_tok_);
    }

    // ---- graphs (cuda_backend_graphs.cpp) ----
    void launch_graph(cudaGraphExec_t g);
    void invalidate_graphs();
    void abort_capture();

    int device_;
    KernelSwitches sw_;
    DeviceCaps dev_;
    int gemm_dq_rows_ = 0; // EMBER_CUDA_GEMM_DQ_ROWS
    bool stream_pin_ = true; // EMBER_STREAM_PIN
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    void* cublas_ws_ = nullptr;
    std::vector<void*> owned_;
    Scratch xq_, xds_, xh_, wh_, batch_dev_, part_acc_, part_ml_, split_ctr_, kv_f16_;
    Scratch moe_;   // the mixture's routing, token groups and expert activations (MoeBuffers)

    // batch mirror
    void* staging_ = nullptr;
    size_t staging_cap_ = 0;
    cudaEvent_t staging_done_ = nullptr;
    void* pinned_out_ = nullptr; // copy_to_host's bounce buffer
    HostCopies uploads_{};
    void* pinned_in_ = nullptr; // copy_from_host's pending small copies, from offset 0 each step
    size_t in_used_ = 0;
    std::vector<HostBlock> host_blocks_; // from alloc_host
    int32_t cap_tok_ = 0, cap_seq_ = 0, bt_stride_ = 0;
    DeviceBatch dbatch_{};
    RopeTables ropes_;
    int32_t n_tok_ = 0, n_seq_ = 0, max_len_ = 0;
    int n_tiles_[kNumTileLens] = {};
    uint64_t batch_sig_ = 0;

    // graphs. A key names the batch's composition (sequences, state slots, lengths' tiles), so a server
    // meets new keys for as long as it runs: once kMaxStepKeys have been seen, every recorded step is
    // dropped and recorded again as it recurs.
    static constexpr size_t kMaxStepKeys = 256;
    std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
    std::unordered_set<uint64_t> seen_;
    // Steps whose first (eager) run waited on the host mid-way (copy_to_host, synchronize: the contract's
    // default compositions, e.g. Backend::moe's grouping on the host): a capture cannot hold such a wait,
    // so these keys always run eagerly.
    std::unordered_set<uint64_t> host_bound_;
    uint64_t graph_gen_ = 0, capture_key_ = 0, capture_gen_ = 0, eager_key_ = 0;
    bool capturing_ = false;
    bool eager_step_ = false, host_waited_ = false;   // a step's first run is going; it waited on the host
    // The batch asks for kernels whose per-token results do not depend on the batch
    // (BatchInfo::batch_invariant): no decode-only fusions, the integer GEMV for every size,
    // attention one query per tile without key splits.
    bool invariant_ = false;
    // The batch lets short contexts take attention_short (BatchInfo::fast_attention).
    bool fast_attn_ = false;
};

} // namespace cuda
} // namespace ember
