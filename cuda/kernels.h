// Launchers of the CUDA backend's kernels (one .cu file per kernel family). All are
// asynchronous on the given stream and never synchronize, so a decode step can be captured.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
#include "ember/quant.h"
#include "kernel_choice.h"
#include "weight_pack.h"

namespace ember {
namespace cuda {

// A weight as the GEMV / dequantize kernels see it.
struct DeviceWeight {
    GGMLType type;
    const uint8_t* base;   // packed layout (weight_pack.h)
    PackedLayout layout;
    int64_t n_in, n_out;
};

// Activations as q8_1-style blocks of 32: q int8 [n_tok][n], ds float2 [n_tok][n/32] holding
// (scale d, d * sum of the block's quants), so an offset format's constant term costs one FMA.
void quantize_q8_1(const float* x, int8_t* q, float2* ds, int32_t n_tok, int64_t n, cudaStream_t s);
void convert_to_f16(const float* x, __half* y, int64_t n, cudaStream_t s);
void convert_to_bf16(const float* x, __nv_bfloat16* y, int64_t n, cudaStream_t s);

// Which of the kernels below take which types and sizes: kernel_choice.h.
// y_i [n_tok][n_out_i] = x [n_tok][n_in] * W_i^T for up to kMaxGemvBatch weights of one type
// and width (Q, K, V or gate, up) in one launch; n_tok <= kMaxGemvTokens.
constexpr int kMaxGemvBatch = 3;
void gemv(const DeviceWeight* const* w, float* const* y, int count, const float* x, const int8_t* xq, const float2* xds,
          int32_t n_tok, cudaStream_t s);
// Quantized GEMM on int8 tensor cores (gemm_q8.cu) for kMaxGemvTokens < n_tok <= kMaxGemmQ8Tokens:
// y [n_tok][n_out] = x W^T from x's q8_1 blocks (quantize_q8_1), the weight read from memory once
// per call. The 32-element block formats (gemm_q8_supported); the GEMV's per-block products, summed
// in another order.
void gemm_q8(const DeviceWeight& w, float* y, const int8_t* xq, const float2* xds, int32_t n_tok, cudaStream_t s);
// f16 GEMM on weights dequantized in registers (gemm_dq.cu) for kMaxGemvTokens < n_tok <=
// kMaxGemmDqTokens: y [n_tok][n_out] = x W^T, the weight read from memory once per token tile (64
// tokens; 128 on Hopper's wgmma form) and each element unpacked once per tile, x as f16
// (gemm_dq_input). Q4_0, Q4_1, Q8_0 rows whose width is a multiple of 256 (gemm_dq_supported), and
// Q4_K's and Q6_K's (gemm_kq_supported: the kernel choice gives it those only under
// EMBER_CUDA_GEMM_KQ=1; x tiles of at most 64 tokens).
// The products are f16 weights (d * q rounded, as dequantize_f16) times f16 activations, summed in
// f32 in a fixed order (deterministic).
// x [n_tok][n] (16-byte aligned, n % 32 == 0) -> xh: f16 with each 32-block in gemm_dq's K order.
void gemm_dq_input(const float* x, __half* xh, int32_t n_tok, int64_t n, cudaStream_t s);
// gemm_dq's form for a launch: the kernel choice's (wgmma, or mma.sync) and the wgmma row tile
// (EMBER_CUDA_GEMM_DQ_ROWS: 192 or 256 fixed, 0 the cheaper grid per launch).
struct GemmDqForm {
    bool wgmma = false;
    int rows = 0;
};
// Whether this build holds the wgmma form (sm_90a code; it runs on compute capability 9.0 only).
bool gemm_dq_wgmma_built();
void gemm_dq(const DeviceWeight& w, float* y, const __half* xh, int32_t n_tok, const GemmDqForm& form, cudaStream_t s);
// ys[i] = x ws[i]^T for up to kMaxGemmDqWeights weights of one format and width, in one launch.
constexpr int kMaxGemmDqWeights = 3;
void gemm_dq(const DeviceWeight* const* ws, float* const* ys, int count, const __half* xh, int32_t n_tok,
             const GemmDqForm& form, cudaStream_t s);
// out [n_tok][n_out] = silu(x W_gate^T) * (x W_up^T) in one launch, for the float weight types
// (gemv_swiglu_supported) whose down projection reads float activations.
void gemv_swiglu(const DeviceWeight& gate, const DeviceWeight& up, float* out, const float* x, int32_t n_tok,
                 cudaStream_t s);
// W -> out [n_out][n_in] f16 (quantized types only) for the tensor-core path.
void dequantize_f16(const DeviceWeight& w, __half* out, cudaStream_t s);

// y = rmsnorm(x) * gamma per row [n_tok][dim] (y may be x). Optional fusions: res != null first
// does x += res (written back); q != null also writes y as q8_1 blocks (q, ds) for a following GEMV;
// xh != null also writes y as f16 in gemm_dq's order (dim % 32 == 0) for a following gemm_dq.
void rmsnorm(float* x, const float* res, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y, int8_t* q,
             float2* ds, cudaStream_t s, __half* xh = nullptr);
// x [n_tok][n_heads][head_dim]: each head normed in place by gamma [head_dim], as rmsnorm rounds.
void head_rmsnorm(float* x, const float* gamma, int32_t n_tok, int32_t n_heads, int32_t head_dim, float eps,
                  cudaStream_t s);
// cos_sin: the RopeTables table of the rope's RopeParams covering the batch's positions; the
// first n_rot dimensions of each head of head_dim rotate.
void rope(float* x, const int32_t* pos, int32_t n_tok, int32_t n_heads, int32_t head_dim, int32_t n_rot,
          const float2* cos_sin, bool neox, cudaStream_t s);
// q [n_tok][width]: row t scaled by rope_temperature(pos[t]) (temp_scale, temp_length, temp_offset as
// RopeParams).
void attn_temperature(float* q, const int32_t* pos, int32_t n_tok, int64_t width, float temp_scale, int32_t temp_length,
                      int32_t temp_offset, cudaStream_t s);
// out[i] = act(gate[i]) * up[i] (out may be gate or up).
void gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out, cudaStream_t s);
// gated_act that also writes its output as q8_1 blocks (n % 32 == 0) for the down projection.
void gated_act_q8(Activation act, const float* gate, const float* up, int64_t n, float* out, int8_t* q, float2* ds,
                  cudaStream_t s);
// gated_act written only as f16 in gemm_dq's order (rows of n_row % 32 == 0 values) for the down
// projection's gemm_dq.
void gated_act_dq(Activation act, const float* gate, const float* up, int64_t n, __half* xh, cudaStream_t s);
void add(float* x, const float* y, int64_t n, cudaStream_t s);
// Up to kMaxHostCopies host-to-device copies read straight from pinned host memory by one
// kernel (a decode step's inputs: one graph node, no copy-engine transfer per buffer).
constexpr int kMaxHostCopies = 8;
struct HostCopies {
    int n;
    void* dst[kMaxHostCopies];
    const void* src[kMaxHostCopies];   // pinned (cudaMallocHost) host memory
    size_t bytes[kMaxHostCopies];
};
void copy_from_pinned(const HostCopies& c, cudaStream_t s);
void add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim, cudaStream_t s);
// x[i] *= y[i] (Backend::mul).
void mul(float* x, const float* y, int64_t n, cudaStream_t s);
// x[t][j] = scale[j] * softplus(x[t][j] + bias[j]) (Backend::softplus_gate).
void softplus_gate(float* x, const float* bias, const float* scale, int32_t n_tok, int32_t dim, cudaStream_t s);
// x[i] = x[i] * scale, then cap * tanh(x[i] / cap) where cap > 0 (Backend::scale_softcap).
void scale_softcap(float* x, int64_t n, float scale, float cap, cudaStream_t s);
// ids[r] = the first highest value's index of row r of x [n_rows][width], -1 if none beats -inf.
void argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids, cudaStream_t s);

// ---- Mixture of experts (moe_route.cu, moe_gemv.cu) ----

// A stacked expert weight as the expert GEMVs read it: expert e's packed matrix (weight_pack.h) at
// base + e * stride.
struct MoeExperts {
    GGMLType type;
    const uint8_t* base;
    size_t stride;
    PackedLayout layout;
    int64_t n_in, n_out;
};

// A run of up to chunk_tok rows of one expert's work: rows first.. first + count - 1 of the
// expert-ordered buffers (h, y), their inputs rows xrow.. of x. expert < 0: an unused slot.
struct MoeChunk {
    int32_t expert, first, count, xrow;
};

// Routing: per token, logits (+ router_bias) -> n_used experts and weights as MoeGating says (the
// CPU's arithmetic and order of sums). ascending: a token's experts in ascending order (the order
// the default composition sums them in), else in descending order of selection score
// (Backend::moe_route). chunks (or null): the one-token path's chunks, one a (token, expert) pair.
struct MoeRouteArgs {
    const float* logits;   // [n_tok][n_expert]
    const float* router_bias;
    const float* selection_bias;
    int32_t n_tok, n_expert, n_used;
    int32_t n_group, n_group_used;   // MoeWeights::n_group (<= kMoeMaxGroups); 0 or 1: none
    MoeGating gating;
    bool norm_topk, ascending;
    float weight_scale;
    int32_t* ids;      // [n_tok][n_used]
    float* weights;    // [n_tok][n_used]
    MoeChunk* chunks;  // [n_tok * n_used] or null
};
void moe_route(const MoeRouteArgs& a, cudaStream_t s);
// The grouped path's order: the rows (token, expert pairs) r < rows of ids sorted by expert
// (sorted[i] = r, pos[r] = i), and chunks of up to chunk_tok rows of one expert (xrow = first), the
// slots past the last chunk up to max_chunks unused.
void moe_group(const int32_t* ids, int32_t rows, int32_t n_expert, int32_t chunk_tok, int32_t* sorted, int32_t* pos,
               MoeChunk* chunks, int32_t max_chunks, cudaStream_t s);
// dst row r = src row idx[r] / div (rows of row_bytes, a multiple of 4).
void gather_rows_bytes(const void* src, int64_t row_bytes, const int32_t* idx, int32_t div, int32_t n_rows, void* dst,
                       cudaStream_t s);
// out[t] = sum over the token's n_used rows (ascending slots) of y[pos[t * n_used + k]], plus the
// shared expert's shared[t] (scaled by sigmoid(shared_logit[t]) where that is not null).
void moe_combine(const float* y, const int32_t* pos, int32_t n_tok, int32_t n_used, int64_t n_embd, const float* shared,
                 const float* shared_logit, float* out, cudaStream_t s);
// out[rows[r]] += scale[r] * y[r] (the rows distinct).
void scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* scale, int32_t n_rows, int64_t dim,
                      cudaStream_t s);
void sigmoid(float* x, int64_t n, cudaStream_t s);

// Gate and up of each chunk's rows, written as h[first + t] = act(gate + gate_bias) * (up + up_bias).
// x as q8_1 (xq, xds) for integer types, else float. chunk_tok: 1 or kMaxGemvTokens; with
// kMaxGemvTokens the buffers hold kMaxGemvTokens - 1 rows past the last (read, never used).
struct MoeUpArgs {
    MoeExperts gate, up;
    const float *gate_bias, *up_bias;   // [n_expert][n_ff] or null
    const MoeChunk* chunks;
    const float* x;
    const int8_t* xq;
    const float2* xds;
    float* h;   // [rows][n_ff]
    Activation act;
};
void moe_up(const MoeUpArgs& a, int32_t n_chunks, int32_t chunk_tok, cudaStream_t s);
// Down of each chunk's rows: y[first + t] = weight * (down h[first + t] + down_bias), weight that
// of row sorted[first + t]'s pair.
struct MoeDownArgs {
    MoeExperts down;
    const float* down_bias;   // [n_expert][n_embd] or null
    const MoeChunk* chunks;
    const float* h;
    const int8_t* hq;
    const float2* hds;
    const int32_t* sorted;
    const float* weights;   // [rows] by pair
    float* y;               // [rows][n_embd]
};
void moe_down(const MoeDownArgs& a, int32_t n_chunks, int32_t chunk_tok, cudaStream_t s);
// The one-token path's down projection: out[t] = sum over the token's experts of weight * (down_e
// h[t * n_used + k] + down_bias) (+ the shared expert as moe_combine adds it), one warp an output
// row spread over all the token's experts.
struct MoeDownSumArgs {
    MoeExperts down;
    const float* down_bias;
    const int32_t* ids;
    const float* weights;
    int32_t n_used;
    const float* h;   // [n_tok * n_used][n_ff], pair order
    const int8_t* hq;
    const float2* hds;
    const float* shared;
    const float* shared_logit;
    float* out;
};
void moe_down_sum(const MoeDownSumArgs& a, int32_t n_tok, cudaStream_t s);

// Batch addressing mirrored on the device (fixed buffers, rewritten by set_batch).
struct DeviceBatch {
    const int32_t* pos;           // [n_tok]
    const int32_t* seq;           // [n_tok]
    const int32_t* block_table;   // [n_seq][max_blocks]
    int32_t max_blocks;
};

// kv_store, kv_store_q8, kv_expand_q8, kv_store_bf16, kv_expand_bf16: a null cache is skipped (layers whose K and V types differ
// store and expand each cache with the kernel of its type).
void kv_store(__half* k_cache, __half* v_cache, int32_t block_size, int32_t kv_dim, const float* k, const float* v,
              int32_t n_tok, const DeviceBatch& b, cudaStream_t s);
// q8_0 KV (src/backend/kv_layout.h): store rows as kv_store does; kv_expand_q8 writes the blocks of
// the first n_blk entries of each of n_seq block-table rows as f16 at the same places of an f16
// layer (for kernels that read f16 K/V only).
void kv_store_q8(uint8_t* k_cache, uint8_t* v_cache, int32_t block_size, int32_t kv_dim, int32_t head_dim,
                 const float* k, const float* v, int32_t n_tok, const DeviceBatch& b, cudaStream_t s);
void kv_expand_q8(const uint8_t* k_cache, const uint8_t* v_cache, __half* k_f16, __half* v_f16, int32_t block_size,
                  int32_t kv_dim, int32_t head_dim, int32_t n_blocks, int32_t n_seq, int32_t n_blk,
                  const DeviceBatch& b, cudaStream_t s);
// q4_0 / q4_1 / q5_0 / q5_1 KV (kv_legacy.cu): the same pair for caches of `type` (either may be null).
void kv_store_legacy(GGMLType type, uint8_t* k_cache, uint8_t* v_cache, int32_t block_size, int32_t kv_dim,
                     const float* k, const float* v, int32_t n_tok, const DeviceBatch& b, cudaStream_t s);
void kv_expand_legacy(GGMLType type, const uint8_t* k_cache, const uint8_t* v_cache, __half* k_f16, __half* v_f16,
                      int32_t block_size, int32_t kv_dim, int32_t n_blocks, int32_t n_seq, int32_t n_blk,
                      const DeviceBatch& b, cudaStream_t s);
// bf16 KV (kv_bf16.cu): the same pair for a cache of bf16 rows.
void kv_store_bf16(uint16_t* k_cache, uint16_t* v_cache, int32_t block_size, int32_t kv_dim, const float* k,
                   const float* v, int32_t n_tok, const DeviceBatch& b, cudaStream_t s);
void kv_expand_bf16(const uint16_t* k_cache, const uint16_t* v_cache, __half* k_f16, __half* v_f16, int32_t block_size,
                    int32_t kv_dim, int32_t n_blocks, int32_t n_seq, int32_t n_blk, const DeviceBatch& b,
                    cudaStream_t s);
// f32 KV (attention_float.cu): rows stored as they are (either cache may be null).
void kv_store_f32(float* k_cache, float* v_cache, int32_t block_size, int32_t kv_dim, const float* k, const float* v,
                  int32_t n_tok, const DeviceBatch& b, cudaStream_t s);
// rope of q (may be null) and k over their first n_rot dimensions, then kv_store of k and v (both
// caches null: the ropes only; the caches need n_rot == head_dim).
void rope_kv_store(float* q, int32_t n_head_q, float* k, const float* v, int32_t n_head_kv, int32_t head_dim,
                   int32_t n_rot, const float2* cos_sin, bool neox, __half* k_cache, __half* v_cache,
                   int32_t block_size, int32_t n_tok, const DeviceBatch& b, bool early,
                   cudaStream_t s);   // early: let the next kernel start at once

// The same ropes (normal mode only) and f16 KV store done by the Q, K, V GEMV as it writes its
// rows, when gemv_takes_rope_store: one launch a layer less. w and y are q, k, v in that order.
struct QkvRopeStore {
    const float2* cos_sin;   // the RopeTables table of the rope's RopeParams for the batch's positions
    __half* k_cache;
    __half* v_cache;
    int32_t block_size, head_dim;
    DeviceBatch b;
};
bool gemv_takes_rope_store(const DeviceWeight& q, const DeviceWeight& k, const DeviceWeight& v, int32_t head_dim);
void gemv_rope_store(const DeviceWeight* const* w, float* const* y, const float* x, const int8_t* xq, const float2* xds,
                     int32_t n_tok, const QkvRopeStore& rope, cudaStream_t s);

// A run of <= tile_len consecutive batch tokens of one sequence: attention shares K/V loads
// among the tile's queries. Built on the host by set_batch for each tile length.
struct AttnTile {
    int32_t first, count;
};

struct AttentionArgs {
    const __half* k_cache;        // f16 rows, or q8_0 blocks when kv_q8 (attention_decode only)
    const __half* v_cache;
    bool kv_q8;
    int32_t block_size, n_head, n_head_kv, head_dim;
    int64_t cache_rows;           // rows of k_cache and v_cache (blocks x block_size)
    float scale;
    int32_t window;               // > 0: a query at position p sees keys p - window < j <= p only
    int32_t chunk;                // > 0: a query at position p sees keys of its own chunk only (never with window)
    const float* sinks;           // [n_head] sink logits (device; AttentionShape::sinks) or null
    float softcap;                // > 0: scores soft-capped (AttentionShape::softcap)
    const float* q;               // [n_tok][n_head * head_dim]
    float* out;                   // [n_tok][n_head * head_dim]
    int32_t n_tok;
    const AttnTile* tiles;        // device
    int32_t n_tiles, tile_len;    // tokens per tile (1, 2, 4 or 8)
    int32_t heads_per_cta;        // q heads of one kv head handled together
    int32_t n_split;              // key range split into this many parts (flash-decoding)
    float* part_acc;              // [n_split][n_tok][n_head][head_dim] when n_split > 1
    float2* part_ml;              // [n_split][n_tok][n_head] (running max, sum of exp)
    int32_t* split_counter;       // [n_tiles][grid.y] zeros: CTAs done per (tile, head chunk)
    int8_t* out_q;                // attention_exact: out also as q8_1 blocks (or null)
    float2* out_ds;
    bool old_rows_ready;          // each token the only one of its sequence in the step: the K/V
                                  // rows before its position were written by earlier steps
};
// The first key a query at position p sees (p - window + 1, its chunk's first, or 0); keys up to p.
__host__ __device__ inline int attention_first_key(const AttentionArgs& a, int p) {
    if (a.window > 0) return p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    return a.chunk > 0 && p > 0 ? p - p % a.chunk : 0;
}
void attention(const AttentionArgs& a, const DeviceBatch& b, cudaStream_t s);
// Decode batches (one CTA per token) over long contexts: K/V tiles pipelined through shared
// memory, the q8_0 cache on CUDA cores (attention_decode), the f16 cache on tensor cores
// (attention_decode_mma, up to kDecodeMmaHeads q heads of a kv head per CTA).
// attention_decode_heads: q heads per CTA. Grid: n_tok x (kv heads x head groups) x n_split.
void attention_decode(const AttentionArgs& a, const DeviceBatch& b, cudaStream_t s);
void attention_decode_mma(const AttentionArgs& a, const DeviceBatch& b, cudaStream_t s);
// Short contexts (every position < kExactMaxLen): the reference CPU arithmetic, in order.
// clusters: on Hopper, spread each head over a thread-block cluster (else one CTA a head).
void attention_exact(const AttentionArgs& a, const DeviceBatch& b, bool clusters, cudaStream_t s);
// Decode batches (each token the only one of its sequence in the step) over short f16 contexts
// (every position < kShortMaxLen), for steps that need not keep the CPU's order of sums (the
// engine's default mode, opt-in). Returns false, launching nothing, for shapes it does not take.
bool attention_short(const AttentionArgs& a, const DeviceBatch& b, int32_t max_len, cudaStream_t s);
// Prompt batches on tensor cores: tiles of kMmaTileLen tokens (a.tiles / a.n_tiles), one q head
// per CTA, no split. Returns false (nothing launched) for head dims it does not handle.
bool attention_prefill_mma(const AttentionArgs& a, const DeviceBatch& b, cudaStream_t s);
// Layers with an f32 cache: every step in f32 (q unrounded, accurate exponentials), one CTA per
// (token, q head). k_f32 / v_f32: which cache holds f32 rows (the other is read as f16).
void attention_float(const AttentionArgs& a, bool k_f32, bool v_f32, const DeviceBatch& b, cudaStream_t s);

}  // namespace cuda
}  // namespace ember
