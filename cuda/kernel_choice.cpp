// The CUDA backend's kernel choices (kernel_choice.h): pure C++, built into the CPU build too, so
// the choice table is tested without a GPU.
#include "kernel_choice.h"

#include <algorithm>

#include "backend/kv_layout.h"
#include "backend/switches.h"
#include "ember/status.h"

namespace ember {
namespace cuda {

namespace {

bool is_float(GGMLType t) { return t == GGMLType::F32 || t == GGMLType::F16 || t == GGMLType::BF16; }

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

void check_batch(const BatchFacts& b, const char* what) {
    if (b.n_tok < 0) fail("cuda ", what, " choice: negative n_tok ", b.n_tok);
    if (b.decode_step && b.n_tok > kMaxGraphDecodeTokens)
        fail("cuda ", what, " choice: a decode step of ", b.n_tok, " sequences is above ", kMaxGraphDecodeTokens);
}

void check_weight(const MatmulQuery& q) {
    if (!cuda_weight_type(q.type))
        fail("cuda matmul choice: weight type ", uint32_t(q.type), " is not run by the CUDA backend");
    if (q.n_in < 1) fail("cuda matmul choice: n_in ", q.n_in, " must be at least 1");
    check_batch(q.batch, "matmul");
}

// Batches whose attention the decode kernels take (one query per sequence, each over its own
// context): single-sequence decode sizes and the engine's decode steps.
bool decode_sized(const BatchFacts& b) { return b.n_tok <= kMaxGemvTokens || b.decode_step; }

// gemm_dq takes batches of kMaxGemvTokens < n_tok <= kMaxGemmDqTokens of its formats and widths
// (before gemm_q8 and cuBLAS), and the engine's decode steps of 2..kMaxGemvTokens sequences (one
// weight read for all of them instead of the GEMV's per-token work); never rows the GEMV sums in
// the CPU's order up to kMaxIntPromptTokens, never deterministic mode. Where EMBER_CUDA_GEMM_KQ=1
// asks, also its K-quant formats at kMaxGemvTokens < n_tok <= kMaxIntPromptTokens, the batches
// the GEMV takes in chunks (their GEMV never sums in the CPU's order).
bool takes_gemm_dq(const MatmulQuery& q) {
    const int32_t n = q.batch.n_tok;
    if (!q.sw.gemm_dq || q.batch.deterministic) return false;
    if (q.sw.gemm_kq && gemm_kq_supported(q.type, q.n_in)) return n > kMaxGemvTokens && n <= kMaxIntPromptTokens;
    const bool sized = n > kMaxGemvTokens || (n >= 2 && q.batch.decode_step);
    return sized && n <= kMaxGemmDqTokens && gemm_dq_supported(q.type, q.n_in) &&
           !(gemv_cpu_order(q.n_in) && n <= kMaxIntPromptTokens);
}

// gemm_q8 (each weight byte read once a call) takes batches of kMaxGemvTokens < n_tok <=
// kMaxGemmQ8Tokens of its formats, except rows the GEMV sums in the CPU's order (those keep the
// CPU backend's bits).
bool takes_gemm_q8(const MatmulQuery& q) {
    static_assert(kMaxGemmQ8Tokens <= kMaxIntPromptTokens, "input_wants_q8 makes the GEMM's q8_1 blocks");
    const int32_t n = q.batch.n_tok;
    return q.sw.gemm_q8 && n > kMaxGemvTokens && n <= kMaxGemmQ8Tokens && gemm_q8_supported(q.type) &&
           !gemv_cpu_order(q.n_in);
}

// An engine decode step of more than kSuperblockChunkTokens on a super-block (K-quant) format.
bool many_chunks_of_superblocks(const MatmulQuery& q) {
    return !q.batch.deterministic && q.batch.n_tok > kSuperblockChunkTokens && q.batch.decode_step &&
           type_traits(q.type).block_elems == 256;
}

MatmulKernel gemv_kind(const MatmulQuery& q, bool chunks) {
    const bool cpu_order = !is_float(q.type) && type_traits(q.type).block_elems == 32 && gemv_cpu_order(q.n_in);
    if (chunks) return cpu_order ? MatmulKernel::gemv_chunks_cpu_order : MatmulKernel::gemv_chunks;
    return cpu_order ? MatmulKernel::gemv_cpu_order : MatmulKernel::gemv;
}

MatmulKernel cublas_kind(GGMLType t) {
    switch (t) {
        case GGMLType::F32: return MatmulKernel::cublas_f32;
        case GGMLType::F16: return MatmulKernel::cublas_f16;
        case GGMLType::BF16: return MatmulKernel::cublas_bf16;
        default: return MatmulKernel::dequant_cublas;
    }
}

void check_cache(GGMLType t) {
    if (t != GGMLType::F16 && t != GGMLType::BF16 && t != GGMLType::F32 && !kv_type_is_blocked(t))
        fail(
            "cuda attention choice: the GPU keeps KV in f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl, not "
            "in GGML type ",
            uint32_t(t));
}

// The long-context decode kernels take power-of-two KV blocks of >= 4 tokens: q heads per CTA, 0
// when they do not take the layer.
int decode_heads(const AttentionQuery& q, int32_t n_head, bool kv_q8) {
    const bool blocks = (q.block_size & (q.block_size - 1)) == 0 && q.block_size >= 4;
    return blocks ? attention_decode_heads(n_head, q.n_head_kv, q.head_dim, kv_q8) : 0;
}

// The reference-order kernel (f16 K/V, every position < kExactMaxLen); deterministic steps take it
// for any number of tokens (each token's result is its own).
bool exact_attention(const AttentionQuery& q) {
    return (q.batch.n_tok <= kMaxIntPromptTokens || q.batch.deterministic) && q.max_len <= kExactMaxLen &&
           q.sw.exact_attn && q.head_dim % 8 == 0 && q.head_dim <= kMaxNarrowHeadDim;
}

// A decode step of up to kMaxIntPromptTokens sequences over a short f16 context that need not keep
// the CPU's order of sums, where EMBER_CUDA_SHORT_ATTN=1 asks for it: the latency-built kernel,
// which copies the older K/V rows before its PDL wait (so only batches whose tokens each are the
// only one of their sequence). Larger steps are bound by their KV bytes, which attention_decode_mma
// streams faster. Opt-in: its float q and probabilities move the engine's default-mode greedy text
// further from Llama's (docs/performance.md).
bool short_attention(const AttentionQuery& q) {
    const BatchFacts& b = q.batch;
    return q.fast_attention && q.sw.short_attn && !b.deterministic && q.k_type == GGMLType::F16 &&
           q.v_type == GGMLType::F16 && (b.n_tok == 1 || (b.decode_step && b.n_tok <= kMaxIntPromptTokens)) &&
           q.max_len <= kShortMaxLen;
}

// The shapes attention_short takes: whole groups of q heads, head dims 64, 128, 256; contexts
// longer than one CTA's keys need clusters (Hopper).
bool short_takes_shape(const AttentionQuery& q) {
    if (q.n_head % q.n_head_kv || (q.head_dim != 64 && q.head_dim != 128 && q.head_dim != 256)) return false;
    return q.max_len <= kShortKeysPerCta || q.dev.cc >= 90;
}

// An f16 layer's attention for this batch runs attention_decode_mma (the layer's kv heads stand in
// for the q heads: they set only how many heads a CTA takes, not whether the kernel takes it).
bool decode_mma_attention(const AttentionQuery& q) {
    return q.k_type == GGMLType::F16 && q.v_type == GGMLType::F16 && decode_sized(q.batch) && !q.batch.deterministic &&
           !exact_attention(q) && decode_heads(q, q.n_head_kv, false) > 0;
}

void check_attention(const AttentionQuery& q) {
    check_cache(q.k_type);
    check_cache(q.v_type);
    if (q.head_dim < 1 || q.n_head < 1 || q.n_head_kv < 1 || q.block_size < 1)
        fail("cuda attention choice: head_dim ", q.head_dim, ", ", q.n_head, " heads, ", q.n_head_kv,
             " kv heads and block ", q.block_size, " must all be at least 1");
    if (q.head_dim > kMaxAttnHeadDim)
        fail("cuda attention choice: head_dim ", q.head_dim, " is above ", kMaxAttnHeadDim,
             ", the widest head the attention kernels take");
    if (q.max_len < 0) fail("cuda attention choice: negative context length ", q.max_len);
    if (q.window < 0) fail("cuda attention choice: negative window ", q.window);
    check_batch(q.batch, "attention");
}

}  // namespace

bool cuda_weight_type(GGMLType type) {
    switch (type) {
        case GGMLType::F32:
        case GGMLType::F16:
        case GGMLType::BF16:
        case GGMLType::Q4_0:
        case GGMLType::Q4_1:
        case GGMLType::Q5_0:
        case GGMLType::Q5_1:
        case GGMLType::Q8_0:
        case GGMLType::Q2_K:
        case GGMLType::Q3_K:
        case GGMLType::Q4_K:
        case GGMLType::Q5_K:
        case GGMLType::Q6_K:
        case GGMLType::MXFP4:
        case GGMLType::IQ4_NL:
        case GGMLType::IQ4_XS:
        case GGMLType::IQ3_S:
        case GGMLType::IQ3_XXS:
        case GGMLType::IQ2_XXS:
        case GGMLType::IQ2_XS:
        case GGMLType::IQ2_S:
        case GGMLType::IQ1_S:
        case GGMLType::IQ1_M:
        case GGMLType::TQ1_0:
        case GGMLType::TQ2_0:
        case GGMLType::NVFP4: return true;
        default: return false;
    }
}

bool gemv_wants_q8(GGMLType type) { return !is_float(type); }

bool gemv_cpu_order(int64_t n_in) { return n_in <= kLegacyExactMaxWidth; }

bool gemm_q8_supported(GGMLType type) {
    switch (type) {
        case GGMLType::Q4_0:
        case GGMLType::Q4_1:
        case GGMLType::Q5_0:
        case GGMLType::Q5_1:
        case GGMLType::Q8_0:
        case GGMLType::MXFP4:
        case GGMLType::IQ4_NL: return true;
        default: return false;
    }
}

bool gemm_dq_supported(GGMLType type, int64_t n_in) {
    const bool format = type == GGMLType::Q4_0 || type == GGMLType::Q4_1 || type == GGMLType::Q8_0;
    return format && n_in % kGemmDqAlign == 0;
}

bool gemm_kq_supported(GGMLType type, int64_t n_in) {
    return (type == GGMLType::Q4_K || type == GGMLType::Q6_K) && n_in % kGemmDqAlign == 0;
}

bool gemv_swiglu_supported(GGMLType type) { return is_float(type); }

int attention_decode_heads(int n_head, int n_head_kv, int head_dim, bool kv_q8) {
    if (head_dim != 64 && head_dim != 128 && head_dim != 256) return 0;
    return std::min(n_head / n_head_kv, kv_q8 ? kDecodeQ8Heads : kDecodeMmaHeads);
}

KernelSwitches kernel_switches(const Switches& s) {
    KernelSwitches k;
    k.graphs = s.on("EMBER_CUDA_GRAPHS");
    k.graph_log = s.on("EMBER_CUDA_GRAPH_LOG");
    k.fuse = s.on("EMBER_CUDA_FUSE");
    k.pdl = s.on("EMBER_CUDA_PDL");
    k.exact_attn = s.on("EMBER_CUDA_EXACT_ATTN");
    k.exact_cluster = s.on("EMBER_CUDA_EXACT_CLUSTER");
    k.short_attn = s.on("EMBER_CUDA_SHORT_ATTN");
    k.gemm_q8 = s.on("EMBER_CUDA_GEMM_Q8");
    k.gemm_dq = s.on("EMBER_CUDA_GEMM_DQ");
    k.gemm_dq_wgmma = s.on("EMBER_CUDA_GEMM_DQ_WGMMA");
    k.gemm_kq = s.on("EMBER_CUDA_GEMM_KQ");
    return k;
}

const char* matmul_kernel_name(MatmulKernel k) {
    switch (k) {
        case MatmulKernel::gemv: return "gemv";
        case MatmulKernel::gemv_cpu_order: return "gemv_cpu_order";
        case MatmulKernel::gemv_chunks: return "gemv_chunks";
        case MatmulKernel::gemv_chunks_cpu_order: return "gemv_chunks_cpu_order";
        case MatmulKernel::gemm_dq_wgmma: return "gemm_dq_wgmma";
        case MatmulKernel::gemm_dq_mma_sync: return "gemm_dq_mma_sync";
        case MatmulKernel::gemm_q8: return "gemm_q8";
        case MatmulKernel::cublas_f32: return "cublas_f32";
        case MatmulKernel::cublas_f16: return "cublas_f16";
        case MatmulKernel::cublas_bf16: return "cublas_bf16";
        case MatmulKernel::dequant_cublas: return "dequant_cublas";
    }
    return "?";
}

bool is_gemv(MatmulKernel k) {
    return k == MatmulKernel::gemv || k == MatmulKernel::gemv_cpu_order || k == MatmulKernel::gemv_chunks ||
           k == MatmulKernel::gemv_chunks_cpu_order;
}

bool is_gemm_dq(MatmulKernel k) { return k == MatmulKernel::gemm_dq_wgmma || k == MatmulKernel::gemm_dq_mma_sync; }

// Deterministic mode: the GEMV for every size, in chunks (a token's sums do not depend on the rest
// of the batch). Otherwise in order: gemm_dq, the one-launch GEMV of decode sizes, gemm_q8, then
// cuBLAS for prompts past kMaxIntPromptTokens, float weights past the GEMV's sizes and K-quant
// decode steps of many chunks; what is left (the CPU's rounding) the GEMV in chunks.
MatmulKernel choose_matmul(const MatmulQuery& q) {
    check_weight(q);
    const int32_t n = q.batch.n_tok;
    if (q.batch.deterministic) return gemv_kind(q, n > kMaxGemvTokens);
    if (takes_gemm_dq(q)) {
        // wgmma needs the build's sm_90a code and a GPU that runs it (9.0 exactly: newer GPUs JIT the
        // sm_90 PTX, which has no wgmma).
        const bool wgmma = q.sw.gemm_dq_wgmma && q.dev.sm90a_build && q.dev.cc == 90;
        return wgmma ? MatmulKernel::gemm_dq_wgmma : MatmulKernel::gemm_dq_mma_sync;
    }
    if (n <= kMaxGemvTokens) return gemv_kind(q, false);
    if (takes_gemm_q8(q)) return MatmulKernel::gemm_q8;
    if (n > kMaxIntPromptTokens || !gemv_wants_q8(q.type) || many_chunks_of_superblocks(q)) return cublas_kind(q.type);
    return gemv_kind(q, true);
}

bool matmul_reads_q8(const MatmulQuery& q) {
    check_weight(q);
    return gemv_wants_q8(q.type) &&
           (q.batch.deterministic || (q.batch.n_tok <= kMaxIntPromptTokens && !takes_gemm_dq(q)));
}

bool input_wants_q8(int32_t n_tok, int64_t width, bool any_wants_q8) {
    return n_tok > 0 && n_tok <= kMaxIntPromptTokens && width % 32 == 0 && any_wants_q8;
}

bool ffn_takes_gemv_swiglu(bool silu, GGMLType gate, GGMLType up, const BatchFacts& b) {
    return silu && b.n_tok <= kMaxGemvTokens && gate == up && gemv_swiglu_supported(gate) && !b.deterministic;
}

bool qkv_may_take_rope_store(bool plain, bool f16_cache, bool neox, const MatmulQuery& wq) {
    check_weight(wq);
    return plain && f16_cache && !neox && wq.batch.n_tok <= kMaxGemvTokens && !wq.batch.deterministic &&
           !takes_gemm_dq(wq);
}

// The expert GEMVs take every type the dense GEMV does but IQ2_XS, IQ2_S, Q2_K and Q3_K, whose formats
// they do not instantiate yet (those experts take the default composition).
bool moe_gemv_supported(GGMLType type) {
    switch (type) {
        case GGMLType::Q2_K:
        case GGMLType::Q3_K:
        case GGMLType::IQ2_XS:
        case GGMLType::IQ2_S:
        case GGMLType::IQ1_S:
        case GGMLType::IQ1_M:
        case GGMLType::TQ1_0:
        case GGMLType::TQ2_0:
        case GGMLType::NVFP4: return false;   // no expert GEMV format
        default: return cuda_weight_type(type);
    }
}

const char* moe_kernel_name(MoeKernel k) {
    switch (k) {
        case MoeKernel::pairs: return "pairs";
        case MoeKernel::grouped: return "grouped";
        case MoeKernel::composed: return "composed";
    }
    return "?";
}

// The expert kernels read every type the GEMV reads; gate and up go through one launch, so they
// share a type. Deterministic steps always group: a grouped token's sums do not depend on the
// chunk it shares, while the one-token path sums in another order.
MoeKernel choose_moe(const MoeQuery& q) {
    for (GGMLType t : {q.gate, q.up, q.down})
        if (!cuda_weight_type(t)) fail("cuda moe choice: expert type ", uint32_t(t), " is not run by the CUDA backend");
    if (q.n_embd < 1 || q.n_ff < 1 || q.n_expert < 1)
        fail("cuda moe choice: n_embd ", q.n_embd, ", n_ff ", q.n_ff, " and ", q.n_expert,
             " experts must all be at least 1");
    if (q.n_used < 1 || q.n_used > q.n_expert)
        fail("cuda moe choice: n_used ", q.n_used, " must lie in 1..", q.n_expert, " (the experts)");
    check_batch(q.batch, "moe");
    const bool kernels = moe_gemv_supported(q.gate) && moe_gemv_supported(q.down) && q.gate == q.up;
    if (!q.sw.fuse || !kernels || q.n_expert > kMoeMaxExperts) return MoeKernel::composed;
    if (q.batch.n_tok <= kMoePairTokens && !q.batch.deterministic) return MoeKernel::pairs;
    return MoeKernel::grouped;
}

bool step_is_graphed(const BatchFacts& b, const KernelSwitches& sw) {
    return sw.graphs && b.n_tok > 0 && (b.n_tok <= kMaxGemvTokens || b.decode_step);
}

const char* attention_kernel_name(AttentionKernel k) {
    switch (k) {
        case AttentionKernel::exact: return "exact";
        case AttentionKernel::exact_cluster: return "exact_cluster";
        case AttentionKernel::short_decode: return "short";
        case AttentionKernel::decode_q8: return "decode_q8";
        case AttentionKernel::decode_mma: return "decode_mma";
        case AttentionKernel::prefill_mma: return "prefill_mma";
        case AttentionKernel::tiled: return "tiled";
        case AttentionKernel::tiled_invariant: return "tiled_invariant";
        case AttentionKernel::float32: return "float32";
    }
    return "?";
}

int attention_want_splits(int32_t max_len, int32_t window) {
    const int32_t span = window > 0 ? std::min(max_len, window + kKeysPerSplit) : max_len;
    return pow2_ceil((span + kKeysPerSplit - 1) / kKeysPerSplit);
}

int attention_splits(int want, int base, int target) {
    return std::max(1, std::min(want, pow2_floor(std::max(1, target / std::max(base, 1)))));
}

// In order: the f32 kernel for a layer with an f32 cache; attention_short where asked for; the reference-order kernel over short contexts;
// deterministic mode's one query a tile; long prompts on tensor cores where the head dim allows;
// decode batches over long contexts on the pipelined decode kernels; the tiled kernel for the rest.
// Heads wider than kMaxNarrowHeadDim take only the tiled kernels, whatever the batch.
// Decode batches over q8_0 caches read the blocks directly; other batches read an f16 copy of the
// blocks they use (their work per KV byte is large, so the copy costs little).
AttentionChoice choose_attention(const AttentionQuery& q) {
    check_attention(q);
    const BatchFacts& b = q.batch;
    AttentionChoice c;
    const bool k_f32 = q.k_type == GGMLType::F32, v_f32 = q.v_type == GGMLType::F32;
    if (k_f32 || v_f32) {   // an f32 cache asks for f32 attention; its other cache is read as f16
        c.kernel = AttentionKernel::float32;
        c.expand_q8 = (!k_f32 && q.k_type != GGMLType::F16) || (!v_f32 && q.v_type != GGMLType::F16);
        return c;
    }
    const int n_rep = q.n_head / q.n_head_kv;
    // q heads x tokens of a tiled CTA (the wide form's shared memory holds fewer).
    const int max_pairs = q.head_dim > kMaxNarrowHeadDim ? kMaxWidePairsPerCta : kMaxHeadsPerCta;
    c.heads_per_cta = std::min(n_rep, max_pairs);
    const bool k_q8 = q.k_type == GGMLType::Q8_0, v_q8 = q.v_type == GGMLType::Q8_0;
    // A q8_0 row block of the layer is a whole number of 16-byte loads (attention_decode's copies).
    const int64_t width = int64_t(q.n_head_kv) * q.head_dim;
    const int64_t q8_block_bytes = int64_t(q.block_size) * width + int64_t(q.block_size) * width / 32 * 2;
    const bool kv_q8 = k_q8 && v_q8 && !b.deterministic && decode_sized(b) && decode_heads(q, q.n_head, true) > 0 &&
                       q8_block_bytes % 16 == 0;
    c.expand_q8 = (q.k_type != GGMLType::F16 || q.v_type != GGMLType::F16) && !kv_q8;
    if (!kv_q8 && short_attention(q) && short_takes_shape(q)) {
        c.kernel = AttentionKernel::short_decode;
        return c;
    }
    if (!kv_q8 && exact_attention(q)) {
        c.kernel = q.sw.exact_cluster && q.dev.cc >= 90 ? AttentionKernel::exact_cluster : AttentionKernel::exact;
        return c;
    }
    if (b.deterministic) {
        c.kernel = AttentionKernel::tiled_invariant;
        return c;
    }
    if (b.n_tok > kMaxIntPromptTokens && !decode_sized(b) && (q.head_dim == 64 || q.head_dim == 128)) {
        c.kernel = AttentionKernel::prefill_mma;
        c.tile_index = kNumTileLens - 1;
        return c;
    }
    const int n_dec = decode_heads(q, q.n_head, kv_q8);
    if (decode_sized(b) && n_dec > 0) {
        c.kernel = kv_q8 ? AttentionKernel::decode_q8 : AttentionKernel::decode_mma;
        const int base = b.n_tok * q.n_head_kv * ((n_rep + n_dec - 1) / n_dec);
        c.n_split = attention_splits(attention_want_splits(q.max_len, q.window), base,
                                     kv_q8 ? kDecodeTargetCtas : kDecodeMmaTargetCtas);
        return c;
    }
    // Prompts: share K/V among up to 8 queries.
    c.kernel = AttentionKernel::tiled;
    if (b.n_tok > kMaxGemvTokens) {
        const int tq = std::max(1, max_pairs / pow2_ceil(c.heads_per_cta));
        while (kTileLens[c.tile_index] < tq) ++c.tile_index;
    }
    return c;
}

AttentionChoice choose_attention_without_short(AttentionQuery q) {
    q.sw.short_attn = false;
    return choose_attention(q);
}

bool attention_starts_early(const AttentionQuery& q) {
    check_attention(q);
    return decode_mma_attention(q) || short_attention(q);
}

}  // namespace cuda
}  // namespace ember
