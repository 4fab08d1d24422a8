// Which kernels the CUDA backend runs: the matmul and attention choices (and the split counts and
// fused forms picked by thresholds) as pure functions of a small query, with no CUDA in them, so the
// CPU build tests and tabulates them (tests/test_kernel_choice.py, docs/cuda.md).
#pragma once
#include <cstdint>

#include "ember/quant.h"

namespace ember {

class Switches;

namespace cuda {

// ---- Thresholds: every size the choices below compare against, in one place ----

// Most tokens one GEMV launch takes (its kernels are compiled for each count up to it): a decode
// step of one sequence, or a chunk of a larger batch.
constexpr int kMaxGemvTokens = 8;
// Prompts up to this many tokens take the decode kernels (integer GEMV in chunks of 8 tokens,
// CUDA-core attention): the same rounding as the reference CPU path, so short prompts and the text
// that follows them agree with it closely. Longer ones use the tensor cores.
constexpr int kMaxIntPromptTokens = 64;
// gemm_q8 scales each 32-block's int32 dot per token in fp32, so its cost grows with the tokens:
// above this, dequantize + cuBLAS is the faster path.
constexpr int kMaxGemmQ8Tokens = 64;
// gemm_dq is faster than dequantize + cuBLAS up to the largest graphed decode step; larger
// batches are prompts, left to cuBLAS.
constexpr int kMaxGemmDqTokens = 256;
// Engine decode steps up to this many sequences are graphed (and count as decode steps here).
constexpr int kMaxGraphDecodeTokens = 256;
// An engine decode step of more GEMV chunks than this on a 256-element super-block format: the
// K-quant GEMV is compute-bound at 8 tokens, so one dequantized cuBLAS GEMM, which reads the weight
// once for all tokens, costs less than a launch per chunk.
constexpr int kSuperblockChunkTokens = 3 * kMaxGemvTokens;
// The 32-element block formats' GEMV sums rows up to this wide in the CPU backend's order
// (gemv_legacy.cuh): it costs instructions, so wider rows take the fast order.
constexpr int64_t kLegacyExactMaxWidth = 2048;
// gemm_dq's rows are whole multiples of this: every stage is whole, every meta row 16-byte aligned.
constexpr int kGemmDqAlign = 256;
// Short contexts (every position below this) take attention_exact, the CPU's order of sums.
constexpr int kExactMaxLen = 512;
// attention_short takes contexts below this: one cluster of at most 8 CTAs of kShortKeysPerCta keys.
constexpr int kShortMaxLen = 512;
constexpr int kShortKeysPerCta = 64;
// Flash-decoding: one key-range split per this many keys.
constexpr int kKeysPerSplit = 64;
// The tiled attention splits keys only while its grid has fewer CTAs than this.
constexpr int kTargetAttnCtas = 1024;
// Decode attention over long contexts: CTAs per launch the key-range split aims at. The q8_0 kernel
// fits about 8 CTAs an SM, the f16 tensor-core kernel 2; one wave of those beat both one CTA an SM
// and two waves (docs/performance.md).
constexpr int kDecodeTargetCtas = 1024;
constexpr int kDecodeMmaTargetCtas = 256;
// q heads of one kv head a decode CTA takes at most: the q8_0 kernel gives each head a warp for
// its softmax; the f16 tensor-core kernel fills an MMA tile's rows.
constexpr int kDecodeQ8Heads = 4;
constexpr int kDecodeMmaHeads = 16;
// The tiled attention shares K/V loads among at most this many q heads of a kv head.
constexpr int kMaxHeadsPerCta = 8;
// Head dims up to this take every attention kernel; wider ones (up to kMaxAttnHeadDim: Gemma 4's
// global layers) only the tiled kernel's wide form, which merges its 4 warps' partial outputs in
// 4 x M x 512 floats of static shared memory: M = kMaxWidePairsPerCta (q heads x tokens a CTA)
// keeps them at 32 KB, within the 48 KB a kernel's static shared memory may take.
constexpr int kMaxNarrowHeadDim = 256;
constexpr int kMaxAttnHeadDim = 512;
constexpr int kMaxWidePairsPerCta = 4;
// A mixture's one-token path (each token's experts their own GEMV rows, the down projection summing
// a token's experts as it writes them) takes batches up to this many tokens; larger ones group the
// tokens by expert, so each chosen expert's rows are read once a chunk of kMaxGemvTokens tokens.
constexpr int kMoePairTokens = 4;
// The grouping kernel counts tokens per expert in shared memory: at most this many experts.
constexpr int kMoeMaxExperts = 4096;
constexpr int kMoeMaxGroups = 64;   // expert groups of group-limited routing (DeepSeek V3 has 8)
// Query tile lengths the tiled attention takes (set_batch builds a tile list for each); the last
// is the prefill tensor-core kernel's.
constexpr int kMmaTileLen = 64;
constexpr int kNumTileLens = 5;
constexpr int kTileLens[kNumTileLens] = {1, 2, 4, 8, kMmaTileLen};

// ---- What the kernels take ----

// The weight types the CUDA backend runs (InvalidInput for others, from the choices below).
bool cuda_weight_type(GGMLType type);
// Whether this type's GEMV reads activations quantized to q8_1 blocks (else float x).
bool gemv_wants_q8(GGMLType type);
// Whether the GEMV sums rows of this width in the CPU backend's order (the 32-element formats).
bool gemv_cpu_order(int64_t n_in);
bool gemm_q8_supported(GGMLType type);
bool gemm_dq_supported(GGMLType type, int64_t n_in);
// The K-quant formats gemm_dq also runs (Q4_K, Q6_K), which the kernel choice gives it only where
// EMBER_CUDA_GEMM_KQ=1 asks (KernelSwitches::gemm_kq): kMaxGemvTokens < n_tok <= kMaxIntPromptTokens.
bool gemm_kq_supported(GGMLType type, int64_t n_in);
// The float types, whose down projection reads float activations: gate, up and SiLU in one GEMV.
bool gemv_swiglu_supported(GGMLType type);
// The types the mixture's expert GEMVs read (moe_gemv.cuh: with_format, expert_units); experts of other
// types take the default composition over matmul.
bool moe_gemv_supported(GGMLType type);
// q heads per CTA of the long-context decode kernels for this shape and cache, 0 when neither takes
// it (head_dim other than 64, 128, 256).
int attention_decode_heads(int n_head, int n_head_kv, int head_dim, bool kv_q8);

// ---- The query ----

// The switches the choices read, taken from the backend's Switches snapshot when it is made.
struct KernelSwitches {
    bool graphs = true, graph_log = false, fuse = true, pdl = true;
    bool exact_attn = true, exact_cluster = true, short_attn = false;
    bool gemm_q8 = true, gemm_dq = true, gemm_dq_wgmma = true, gemm_kq = false;
};
KernelSwitches kernel_switches(const Switches& s);

// The device and the build: compute capability major * 10 + minor; whether the build holds sm_90a
// code (gemm_dq's wgmma form, which runs on compute capability 9.0 only).
struct DeviceCaps {
    int cc = 90;
    bool sm90a_build = true;
};

// What a batch says of its tokens.
struct BatchFacts {
    int32_t n_tok = 1;
    // The op's tokens are a whole engine decode step: one token of each of n_tok sequences, at most
    // kMaxGraphDecodeTokens.
    bool decode_step = false;
    // Deterministic mode (BatchInfo::batch_invariant): each token's result does not depend on the
    // rest of the batch.
    bool deterministic = false;
};

struct MatmulQuery {
    GGMLType type = GGMLType::F16;
    int64_t n_in = 0;
    BatchFacts batch;
    KernelSwitches sw;
    DeviceCaps dev;
};

enum class MatmulKernel {
    gemv,                    // up to kMaxGemvTokens tokens, one launch a run of weights of one type
    gemv_cpu_order,          // the same, rows summed in the CPU backend's order
    gemv_chunks,             // the GEMV over chunks of kMaxGemvTokens tokens, one launch a chunk
    gemv_chunks_cpu_order,
    gemm_dq_wgmma,           // f16 GEMM on weights dequantized in registers, Hopper's wgmma form
    gemm_dq_mma_sync,        // the same on mma.sync
    gemm_q8,                 // int8 tensor-core GEMM on q8_1 activations
    cublas_f32,              // cuBLAS on the weight as it is
    cublas_f16,
    cublas_bf16,
    dequant_cublas,          // dequantize to f16, then cuBLAS
};
const char* matmul_kernel_name(MatmulKernel k);
bool is_gemv(MatmulKernel k);
bool is_gemm_dq(MatmulKernel k);

// InvalidInput for a type the backend does not run, n_tok < 0 or n_in < 1.
MatmulKernel choose_matmul(const MatmulQuery& q);
// Whether the weight's kernel reads x as q8_1 blocks (made by the kernel before, or quantize_q8_1).
bool matmul_reads_q8(const MatmulQuery& q);
// Whether a projection's input should come with q8_1 blocks from the kernel that writes it (a norm,
// an activation): batches up to kMaxIntPromptTokens of widths in whole 32-blocks, where some weight
// of the projection is of a type whose GEMV reads them. any_wants_q8: gemv_wants_q8 of any weight.
bool input_wants_q8(int32_t n_tok, int64_t width, bool any_wants_q8);

// ---- Fused forms ----

// Gate, up and SiLU in one GEMV (float weights of decode-sized batches, default mode).
bool ffn_takes_gemv_swiglu(bool silu, GGMLType gate, GGMLType up, const BatchFacts& b);
// Q, K, V's GEMV may rope q and k and store k and v as it writes its rows: a plain block (no biases,
// no q/k norms), f16 caches, normal rope, decode-sized default-mode batches whose Q weight the GEMV
// takes. The GEMV then checks the shapes (gemv_takes_rope_store).
bool qkv_may_take_rope_store(bool plain, bool f16_cache, bool neox, const MatmulQuery& wq);

// ---- Mixture of experts ----

struct MoeQuery {
    GGMLType gate = GGMLType::Q4_K, up = GGMLType::Q4_K, down = GGMLType::Q4_K;
    int64_t n_embd = 0, n_ff = 0;
    int32_t n_expert = 0, n_used = 0;
    BatchFacts batch;
    KernelSwitches sw;
};

enum class MoeKernel {
    pairs,      // one-token path: a GEMV a (token, expert) pair, the down projection summing a token's experts
    grouped,    // tokens grouped by expert on the device, GEMVs over chunks of one expert's tokens
    composed,   // the Backend's default composition of primitives (EMBER_CUDA_FUSE=0, or shapes the kernels lack)
};
const char* moe_kernel_name(MoeKernel k);
// InvalidInput for an expert type the backend does not run, n_used outside 1..n_expert, non-positive
// widths or a negative n_tok.
MoeKernel choose_moe(const MoeQuery& q);

// ---- Graphs ----

// Whether a step is recorded as a CUDA graph: steps repeat with the same shape every token only in
// decode, so single-sequence decode sizes and the engine's decode steps are, others run eagerly.
bool step_is_graphed(const BatchFacts& b, const KernelSwitches& sw);

// ---- Attention ----

struct AttentionQuery {
    GGMLType k_type = GGMLType::F16, v_type = GGMLType::F16;   // F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
    int32_t head_dim = 128, n_head = 32, n_head_kv = 8, block_size = 16;
    int32_t max_len = 1;   // the batch's longest context: its highest position + 1
    int32_t window = 0;    // > 0: sliding window
    BatchFacts batch;
    bool fast_attention = false;   // BatchInfo::fast_attention: the step may take attention_short
    KernelSwitches sw;
    DeviceCaps dev;
};

enum class AttentionKernel {
    exact,              // attention_exact: the CPU's order of sums (short contexts)
    exact_cluster,      // the same, a thread-block cluster a head where the grid fits the GPU at once
    short_decode,       // attention_short (opt-in, engine decode steps over short f16 contexts)
    decode_q8,          // attention_decode: long-context decode reading the q8_0 cache
    decode_mma,         // attention_decode_mma: long-context decode on tensor cores, f16 cache
    prefill_mma,        // attention_prefill_mma: prompt tiles of kMmaTileLen on tensor cores
    tiled,              // the CUDA-core tiled kernel, queries sharing K/V, keys split
    tiled_invariant,    // the same, one query a tile and one split (deterministic mode)
    float32,            // attention_float: a layer with an f32 cache, every step in f32
};
const char* attention_kernel_name(AttentionKernel k);

struct AttentionChoice {
    AttentionKernel kernel = AttentionKernel::tiled;
    // Some cache is not f16 and the kernel reads f16: the batch's blocks are expanded to f16 first.
    bool expand_q8 = false;
    // The tiled kernels' query tile: kTileLens[tile_index].
    int tile_index = 0;
    // Key-range splits of the decode kernels (1: none); the tiled kernel's depend on the batch's
    // tile count (attention_splits).
    int n_split = 1;
    // q heads of a kv head a CTA takes.
    int heads_per_cta = 1;
};

// InvalidInput for a cache type the GPU does not keep (F32 and others), non-positive shapes, a head
// wider than kMaxAttnHeadDim or a negative length.
AttentionChoice choose_attention(const AttentionQuery& q);
// attention_short declined the shape (its shared memory did not fit): the choice without it.
AttentionChoice choose_attention_without_short(AttentionQuery q);
// The kernel before attention lets it start early (PDL) only where it is the f16 decode kernel,
// which streams older keys meanwhile, or attention_short.
bool attention_starts_early(const AttentionQuery& q);
// Key-range splits wanted for the keys a query tile reads (a power of two).
int attention_want_splits(int32_t max_len, int32_t window);
// Splits for a grid of `base` CTAs aiming at `target`: at most `want`, a power of two, at least 1.
int attention_splits(int want, int base, int target);

}  // namespace cuda
}  // namespace ember
