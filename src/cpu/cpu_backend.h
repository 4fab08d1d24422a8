// The CPU backend: host memory, weights used in place from the mapping, ops on the thread pool.
#pragma once
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_matmul.h"
#include "cpu/thread_pool.h"
#include "backend/backend.h"
#include "backend/switches.h"

namespace ember {

class CpuBackend final : public Backend {
public:
    // Reads its switches (EMBER_SIMD, EMBER_CPU_FAST_GEMM, EMBER_CPU_HANDOUT_KB) here and nowhere else.
    CpuBackend(int n_threads, const Switches& switches);
    const char* name() const override { return "cpu"; }
    bool is_host() const override { return true; }

    void* alloc(size_t bytes) override;
    void free(void* p) override;
    void copy_from_host(void* dst, const void* src, size_t bytes) override;
    void copy_to_host(void* dst, const void* src, size_t bytes) override;
    void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void synchronize() override {}

    Weight prepare_weight(const GGUFTensor& t) override;
    const float* prepare_vector(const GGUFTensor& t) override;
    void set_batch(const BatchInfo& batch) override { batch_ = batch; }

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
    // The token-by-token recurrence, v heads on the pool (cpu_delta_rule.cpp).
    void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                          int32_t n_tok, const DeltaRuleShape& shape, float* state, float* out) override;
    // Channel ranges on the pool (cpu_short_conv.cpp).
    void short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels, int32_t kernel,
                    bool silu, float* state, float* y) override;
    // The token-by-token recurrence, heads on the pool (cpu_ssm_scan.cpp).
    void ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                  int32_t n_tok, const SsmShape& shape, float* state, float* y) override;
    void argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids) override;
    void moe_route(const MoeWeights& w, const float* logits, int32_t n_tok, int32_t* ids, float* weights) override;
    void gather_rows(const float* x, const int32_t* rows, int32_t n_rows, int64_t dim, float* y) override;
    void scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* scale, int32_t n_rows,
                          int64_t dim) override;
    void sigmoid(float* x, int64_t n) override;
    void mul(float* x, const float* y, int64_t n) override;
    void softplus_gate(float* x, const float* bias, const float* scale, int32_t n_tok, int32_t dim) override;
    void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                   int64_t n_rows) override;
    // The encoders' ops (encoder_ops.cpp).
    void layernorm(const float* x, const float* gamma, const float* beta, int32_t n_tok, int32_t dim, float eps,
                   float* y) override;
    void unary(UnaryOp f, float* x, int64_t n) override;
    void encoder_attention(const float* q, const float* k, const float* v, int32_t n_tok, const AttentionShape& shape,
                           float* out) override;
    // Tokens grouped by expert, every used expert's matmuls one pool job per stage (cpu_moe_grouped.cpp):
    // the default composition's bits.
    void moe(const MoeWeights& w, const float* xn, int32_t n_tok, const BlockBuffers& b, float* out) override;

    HostParallelFor host_parallel_for() override;

private:
    // The kernel matmul takes for n_tok tokens of this type in the current batch, and that kernel
    // for w (its input not yet prepared); the bytes of its prepared input, and the input prepared
    // into buf on the calling thread (the pooled preparation's bytes).
    MatmulPath matmul_path(GGMLType type, int32_t n_tok) const;
    MatmulRows matmul_kernel(MatmulPath path, const Weight& w, int32_t n_tok, float* y) const;
    size_t matmul_input_bytes(const MatmulRows& m) const;
    void prepare_matmul_input(MatmulRows& m, const float* x, uint8_t* buf) const;
    // Several matmuls of one stage of the moe: inputs[j] prepared for jobs[j] (once per distinct
    // input and format), then all their rows on the pool as one job.
    void run_matmuls(std::vector<MatmulRows>& jobs, const std::vector<const float*>& inputs);
    // x quantized to the vec_dot format `type` (per token rows of row_bytes(type, n_in)), in act_q_.
    const uint8_t* quantize_input(GGMLType type, const float* x, int64_t n_in, int32_t n_tok);
    // Row chunks per matmul: few, since each hand-out costs a cache-line round trip between cores
    // (at 16-row chunks a third of decode time on 2 threads); eight (up to 4 threads) still
    // rebalance when one thread is late, more threads get two each so that all of them work.
    int64_t n_chunks() const { return std::max<int64_t>(8, 2 * (int64_t)pool_.size()); }
    // Rows per hand-out of a decode matmul. With T threads, the threads that finish first wait
    // out the last chunk (~T/2 chunk times lost), while each thread pays a cache-line round trip
    // per hand-out it takes (chunks / T of them); the sum is least near T * sqrt(bytes / k)
    // chunks, k ~ hand-out cost x a thread's streaming rate x 2. k = 256 KiB: ~160 chunks for a
    // 7B gate/up on 16 threads (what sqrt(bytes * T / 16 KiB) gave there, measured best), and
    // n_chunks() on 2 threads up to 1B models, where more chunks cost more than they save
    // (docs/performance.md).
    // k is EMBER_CPU_HANDOUT_KB (switch_table's fallback; set for diagnosis); 0 = n_chunks() only.
    size_t handout_bytes_;
    int64_t row_grain(int64_t n_rows, size_t w_row) const;

    SimdLevel simd_;   // every kernel this backend calls is this level's (EMBER_SIMD lowers it)
    // The level whose fast batched kernels (gemm_fast.h) the matmuls take: simd_, or scalar (which
    // has none) where EMBER_CPU_FAST_GEMM=0 keeps every batch on vec_dot's exact tiles.
    SimdLevel fast_level_;
    ThreadPool pool_;
    BatchInfo batch_;
    std::vector<uint8_t> act_q_;                   // activations quantized for vec_dot
    std::vector<uint8_t> moe_act_;                 // the moe's prepared inputs of one stage
    std::vector<std::vector<float>> f32_vectors_;  // norm weights converted to f32 when stored as f16
};

}  // namespace ember
