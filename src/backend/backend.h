// The backend contract: the op set a forward pass needs, implemented once per device (src/cpu,
// cuda/): primitives, plus named fused ops with default compositions. Every op takes a batch of
// n_tok tokens that may belong to several sequences; activations are row-major [n_tok][width]
// float32 in the backend's own memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <vector>

#include "backend/delta_rule.h"
#include "backend/rope_angles.h"
#include "backend/short_conv.h"
#include "backend/ssm_scan.h"
#include "ember/gguf.h"

namespace ember {

// A weight matrix [n_out][n_in] stored as n_out rows of n_in elements in `type` blocks. A 3-D
// GGUF tensor [n_expert][n_out][n_in] (a mixture's experts) is n_expert such matrices, expert e's
// at data + e * expert_stride bytes, each laid out as its backend lays out a matrix.
struct Weight {
    GGMLType type = GGMLType::F32;
    int64_t n_in = 0, n_out = 0;
    const void* data = nullptr;   // in the backend's memory (the mmap for the CPU)
    const GGUFTensor* src = nullptr;
    int32_t n_expert = 1;
    size_t expert_stride = 0;
};

// Expert e of a stacked expert weight, as a plain matrix.
inline Weight expert_matrix(const Weight& w, int32_t e) {
    Weight m = w;
    m.data = static_cast<const unsigned char*>(w.data) + size_t(e) * w.expert_stride;
    m.n_expert = 1;
    m.expert_stride = 0;
    return m;
}

// Positions and paged-KV addressing for one forward batch (host copy; backends mirror it).
struct BatchInfo {
    int32_t n_tok = 0;
    std::vector<int32_t> pos;           // [n_tok] position of each token in its sequence
    std::vector<int32_t> seq;           // [n_tok] sequence index (row of block_table)
    int32_t n_seq = 0;
    int32_t max_blocks = 0;             // columns of block_table
    std::vector<int32_t> block_table;   // [n_seq][max_blocks] physical KV block ids
    // Each token's results must not depend on the rest of the batch (the engine's deterministic
    // mode): backends then use kernels whose reductions are the same for every batch shape.
    bool batch_invariant = false;
    // Short contexts may take attention kernels that do not sum in the CPU's order (the engine's
    // default mode). Otherwise they keep it: greedy text then follows the CPU's and llama.cpp's
    // the longest.
    bool fast_attention = false;
    // Token i attends to positions 0..pos[i] of its sequence (causal), or to the last
    // AttentionShape::window of them.
    // [n_seq] each sequence's slot of recurrent state (RecurrentLayer); empty for models without
    // recurrent layers. The caller owns which slot a sequence has, as it owns its KV blocks.
    std::vector<int32_t> state_slot;
};

// The recurrent state of one layer of a hybrid model (the gated DeltaNet layers of Qwen3.5), which
// keeps it in place of KV: n_slots slots, each one sequence's convolution state (its last kernel - 1
// inputs, Backend::short_conv) and delta-rule state (Backend::gated_delta_rule), in the memory of the
// layer's backend. A state cannot be rewound: a sequence cut short is recomputed from its start.
struct RecurrentLayer {
    float* conv = nullptr;   // [n_slots][conv_floats]
    float* ssm = nullptr;    // [n_slots][ssm_floats]
    int64_t conv_floats = 0, ssm_floats = 0;
    int32_t n_slots = 0;
    float* conv_of(int32_t slot) const { return conv + slot * conv_floats; }
    float* ssm_of(int32_t slot) const { return ssm + slot * ssm_floats; }
};

// KV storage of one layer: n_blocks blocks of block_size tokens; K and V each n_blocks blocks
// laid out as src/backend/kv_layout.h says for their own type (F16, BF16, F32: [block_size]
// [n_head_kv * head_dim]). Each type is F16, BF16, F32 (exact reference runs) or a block type of
// kv_layout.h; K and V may differ, as llama.cpp's -ctk / -ctv. v may be k itself (same type):
// the cached rows are read as keys and as values (latent attention), and kv_store then writes them once.
struct KVLayer {
    GGMLType k_type = GGMLType::F16;
    GGMLType v_type = GGMLType::F16;
    void* k = nullptr;
    void* v = nullptr;
    int32_t n_blocks = 0, block_size = 0, n_head_kv = 0, head_dim = 0;
};

// The widest attention head (head_dim) the GPU backend's attention takes: a file whose heads are wider
// runs on the CPU (its architecture says so at placement).
constexpr int32_t kGpuMaxHeadDim = 512;

struct AttentionShape {
    int32_t n_head, n_head_kv, head_dim;
    float scale;          // usually 1/sqrt(head_dim)
    int32_t window = 0;   // > 0: a query at position p sees keys p - window < j <= p only (sliding window)
    // Per-head sink logits (gpt-oss): each head's softmax denominator gains exp(sinks[h]), a key that
    // takes probability mass and adds no value. [n_head] in the backend's memory; null: none.
    const float* sinks = nullptr;
    // > 0: each score s (scaled) becomes softcap * tanh(s / softcap) before the softmax (Gemma 2's
    // attention logit soft-capping); 0: none.
    float softcap = 0.0f;
    // > 0: chunked local attention (llama 4): a query at position p sees keys j <= p of its own chunk
    // only, floor(j / chunk) == floor(p / chunk); 0: none. Not with a window.
    int32_t chunk = 0;
};

// Elementwise functions of Backend::unary: GeLUErf is BERT's exact GELU, x * (1 + erf(x / sqrt 2)) / 2;
// GeLUTanh its tanh form; Tanh the classifier heads' (pooler) activation; ReLUSquared max(x, 0)^2
// (Nemotron-H's MLPs, which have no gate).
enum class UnaryOp { GeLUErf, GeLUTanh, Tanh, ReLUSquared };

// Elementwise gate activation of a gated feed-forward: act(gate) * up. SwiGLUClamped is gpt-oss's:
// g = min(gate, 7), u = clamp(up, -7, 7), out = g * sigmoid(1.702 g) * (u + 1).
enum class Activation { SiLU, GeLUTanh, SwiGLUClamped };

// The weights of a block's attention input: the norm before it, the Q, K, V projections with
// optional biases and optional per-head RMSNorms of q and k (before rope), and the rope.
struct AttnInWeights {
    const float* norm = nullptr;   // [n_embd]
    float eps = 1e-5f;
    const Weight *wq = nullptr, *wk = nullptr, *wv = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;   // null: no bias
    const float *q_norm = nullptr, *k_norm = nullptr;          // [head_dim]; null: none
    int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
    const RopeParams* rope = nullptr;   // null: q and k are not rotated (NoPE layers: SmolLM3)
};

// The weights of a gated feed-forward with the norm before it.
struct FfnWeights {
    const float* norm = nullptr;   // [n_embd]
    float eps = 1e-5f;
    const Weight *gate = nullptr, *up = nullptr, *down = nullptr;
    Activation act = Activation::SiLU;
};

// How a mixture's router turns a token's logits (plus router_bias) into n_used experts and weights.
enum class MoeGating {
    softmax,        // softmax over all experts, the n_used largest; renormalized when norm_topk (Qwen3-MoE, Mixtral)
    topk_softmax,   // the n_used largest logits, softmax over those (gpt-oss)
    sigmoid,        // sigmoid scores; selection by score + selection_bias, weights the scores (DeepSeek V3)
};

// The weights of a mixture-of-experts feed-forward with the norm before it. Experts are stacked
// Weights (n_expert matrices each). Ties in the top-k go to the lower expert index.
struct MoeWeights {
    const float* norm = nullptr;   // [n_embd]
    float eps = 1e-5f;
    const Weight* router = nullptr;           // [n_expert][n_embd]
    const float* router_bias = nullptr;       // [n_expert] added to the logits; null: none
    const float* selection_bias = nullptr;    // [n_expert] sigmoid gating: added for the choice only
    const Weight *gate = nullptr, *up = nullptr, *down = nullptr;      // stacked [n_expert][n_ff][n_embd], ...
    const float *gate_bias = nullptr, *up_bias = nullptr;              // [n_expert][n_ff]; null: none
    const float* down_bias = nullptr;                                   // [n_expert][n_embd]; null: none
    int32_t n_expert = 0, n_used = 0;
    MoeGating gating = MoeGating::softmax;
    bool norm_topk = false;      // divide the chosen weights by their sum
    float weight_scale = 1.0f;   // the chosen weights are multiplied by it (after any renormalization)
    // Group-limited choice (DeepSeek V3): the experts form n_group equal groups, each scored by the sum
    // of its two best selection scores; only the n_group_used best groups (ties to the lower index) are
    // chosen from. n_group 0 or 1: none.
    int32_t n_group = 0, n_group_used = 0;
    Activation act = Activation::SiLU;
    // The chosen weight scales the expert's input row instead of its output (llama 4: expert(w * xn)).
    bool weight_input = false;
    // A shared expert every token runs, added to the routed sum (null: none); with shared_gate_inp
    // ([1][n_embd]) its output is scaled by sigmoid(shared_gate_inp . xn) first.
    const Weight *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr;
    const Weight* shared_gate_inp = nullptr;
    int64_t n_ff() const { return gate->n_out; }
};

// Floats of BlockBuffers::moe a mixture's op may use for n_tok tokens; each backend lays out its
// scratch within them as it needs.
inline int64_t moe_scratch_floats(int64_t n_tok, int64_t n_embd, int64_t n_ff, int64_t n_expert, int64_t n_used) {
    const int64_t rows = n_tok * n_used;
    return n_tok * n_expert + 4 * rows + 2 * rows * n_ff + rows * n_embd + 2 * n_tok * (n_ff + n_embd) + 4 * n_expert +
           1024;
}

// A pointer into scratch moved up to the next 64 bytes: the GPU's kernels read rows with vector loads, so
// the compositions' row buffers start aligned (moe_scratch_floats' slack covers the steps).
inline float* aligned_scratch(float* p) {
    return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

// A batch's routed rows grouped by expert (host memory): group e is entries [first[e], first[e + 1])
// of tok (its tokens, ascending) and weight (their routing weights), experts ascending.
struct MoeGroups {
    std::vector<int64_t> first;   // [n_expert + 1]
    std::vector<int32_t> tok;     // [n_tok * n_used]
    std::vector<float> weight;    // [n_tok * n_used]
};
MoeGroups moe_groups(const int32_t* ids, const float* weights, int32_t n_tok, int32_t n_used, int32_t n_expert);

// Activation buffers the fused ops work in, each [n_tok][width] in the backend's memory. After
// attn_in only q is defined (rotated); after attn_out, att; the others are scratch.
struct BlockBuffers {
    float* xn;     // [n_embd] normed input of a projection
    float* q;      // [n_head * head_dim]
    float* k;      // [n_head_kv * head_dim]
    float* v;      // [n_head_kv * head_dim]
    float* att;    // [n_head * head_dim] attention output before the O projection
    float* gate;   // [n_ff]
    float* up;     // [n_ff]
    float* moe = nullptr;   // mixture blocks: moe_scratch_floats(n_tok, ...) floats of scratch
    // recurrent blocks: Architecture::recurrent_scratch_floats(hp) floats per token of scratch
    float* recurrent = nullptr;
};

// Device staging for blocks whose weights and KV live in host memory, so that large batches can
// run them on a GPU (llama.cpp does the same for prompt batches). Two sets of weight slots: block
// l+1's upload (on a copy stream) overlaps block l's compute, which reads the other set.
class WeightStream {
public:
    virtual ~WeightStream() = default;
    // Starts copying block `layer`'s host weights (as given to open_stream) into staging set `set`
    // (0 or 1), after the ops issued before the last release(set); returns them as Weights of the
    // backend, readable by ops issued after acquire(set).
    virtual std::vector<Weight> upload(int set, int layer) = 0;
    virtual void acquire(int set) = 0;   // ops issued from now on run after set's upload
    virtual void release(int set) = 0;   // ops issued until now are the last to read set
    // Device -> host copy ordered after the ops issued so far; the host memory is written by the
    // time the backend's next copy_to_host or synchronize returns.
    virtual void copy_to_host_async(void* host, const void* dev, size_t bytes) = 0;
    // Host memory the copies use at full speed (pinned), freed with the stream; null when none is left.
    virtual void* alloc_host(size_t bytes) = 0;
};

// Runs fn(begin, end) over [0, n) in chunks of `grain` on host threads.
using HostParallelFor = std::function<void(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn)>;

struct StreamSetup {
    std::vector<std::vector<Weight>> blocks;   // [n_layer] host weights of each block; empty: not streamed
    HostParallelFor parallel_for;              // fills pinned bounce buffers when the mapping cannot be pinned
    bool verbose = false;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char* name() const = 0;
    virtual bool is_host() const = 0;   // memory directly addressable by the CPU

    virtual void* alloc(size_t bytes) = 0;   // throws OutOfMemory naming the size and free memory
    virtual void free(void* p) = 0;
    virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
    virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
    virtual void synchronize() = 0;
    // Device -> host copy ordered after the ops issued so far, done by the time the next
    // copy_to_host or synchronize returns (KV rows written back to host memory while the GPU goes on). By
    // default the synchronous copy.
    virtual void copy_to_host_async(void* dst, const void* src, size_t bytes) { copy_to_host(dst, src, bytes); }
    // Copies within this backend's memory (both from alloc), ordered with its ops (KV blocks
    // between the staging and the GPU cache of the KV in host memory). By default through host memory.
    virtual void copy(void* dst, const void* src, size_t bytes) {
        std::vector<unsigned char> tmp(bytes);
        copy_to_host(tmp.data(), src, bytes);
        copy_from_host(dst, tmp.data(), bytes);
    }
    // Host memory that copy_to_host / copy_from_host reach at full speed (CUDA: pinned, so a
    // decode step's logits land without a bounce copy); by default plain heap memory.
    virtual void* alloc_host(size_t bytes) { return ::operator new(bytes); }
    virtual void free_host(void* p) { ::operator delete(p); }
    // Device memory free now, for the placement's GPU budget; 0 where unknown or host memory.
    virtual size_t free_memory() { return 0; }

    // Makes a weight usable by this backend (CPU: points into the mapping; GPU: uploads once).
    virtual Weight prepare_weight(const GGUFTensor& t) = 0;
    // Small F32 vectors (norm weights, biases): returns backend memory holding n floats.
    virtual const float* prepare_vector(const GGUFTensor& t) = 0;

    virtual void set_batch(const BatchInfo& batch) = 0;

    // ---- primitives ----
    // y[t][o] = sum_i W[o][i] * x[t][i]
    virtual void matmul(const Weight& w, const float* x, int32_t n_tok, float* y) = 0;
    // ys[i] = x * ws[i]^T for weights that read the same input (Q, K, V; gate, up). Backends
    // may share the input's preparation and one hand-out of rows; by default, matmul per weight.
    virtual void matmul_many(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok) {
        for (int i = 0; i < count; ++i) matmul(*ws[i], x, n_tok, ys[i]);
    }
    // y[t] = x[t] / rms(x[t]) * gamma; y may be x (in place).
    virtual void rmsnorm(const float* x, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y) = 0;
    // x [n_tok][n_heads][head_dim]: each head normed in place by gamma [head_dim] (Qwen3, Gemma 3 q/k norm);
    // gamma null: no weight (llama 4's L2 norm of q and k; Gemma 4's v norm).
    virtual void head_rmsnorm(float* x, const float* gamma, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                              float eps) = 0;
    // Grouped RMS norm (Mamba2's norm after its gate): each row of x [n_rows][width] is n_groups equal
    // groups, each scaled to unit root mean square over its width / n_groups elements (summed in double
    // on the CPU), then by gamma [width] (each group by its own part). y may be x (in place).
    virtual void rmsnorm_grouped(const float* x, const float* gamma, int32_t n_rows, int64_t width, int32_t n_groups,
                                 float eps, float* y) = 0;
    // x: [n_tok][n_heads * rope.head_dim], rotated in place at the batch positions (each head's
    // first rope.rotated() dimensions; the rest pass through).
    virtual void rope(float* x, int32_t n_tok, int32_t n_heads, const RopeParams& rope) = 0;
    // q [n_tok][width]: each token's row scaled by rope_temperature(its position, rope) (the
    // attention temperature of llama 4 and Mistral 3; queries only).
    virtual void attn_temperature(float* q, int32_t n_tok, int64_t width, const RopeParams& rope) = 0;
    // Stores k, v [n_tok][n_head_kv * head_dim] at each token's (sequence, position).
    virtual void kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) = 0;
    // q [n_tok][n_head * head_dim] -> out [n_tok][n_head * head_dim], causal over the
    // sequence's blocks (GQA: head h reads kv head h / (n_head / n_head_kv)), within shape.window.
    virtual void attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape,
                           float* out) = 0;
    // out[i] = act(gate[i]) * up[i]; out may be gate.
    virtual void gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out) = 0;
    // x[i] += y[i]
    virtual void add(float* x, const float* y, int64_t n) = 0;
    // x[t][j] += bias[j]
    virtual void add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim) = 0;
    // ids[r] = greedy_token(x[r], width) (backend/greedy_token.h) for each of n_rows rows: the greedy
    // choice where the logits lie, so only the ids need to reach the host.
    virtual void argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids) = 0;
    // A mixture's routing: each token's n_used experts (ids) and their weights, both [n_tok][w.n_used],
    // from its router logits [n_tok][w.n_expert] (router bias already added), as w.gating,
    // w.selection_bias, w.norm_topk and w.weight_scale say. A token's experts are in descending order
    // of selection score, ties to the lower expert index.
    virtual void moe_route(const MoeWeights& w, const float* logits, int32_t n_tok, int32_t* ids, float* weights) = 0;
    // y[r] = x[rows[r]] for r < n_rows (rows of dim floats).
    virtual void gather_rows(const float* x, const int32_t* rows, int32_t n_rows, int64_t dim, float* y) = 0;
    // out[rows[r]] += scale[r] * y[r] for r < n_rows; the rows of one call are distinct.
    virtual void scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* scale, int32_t n_rows,
                                  int64_t dim) = 0;
    // x[i] = 1 / (1 + exp(-x[i]))
    virtual void sigmoid(float* x, int64_t n) = 0;
    // x[i] *= y[i] (an elementwise product: LFM2's convolution gates, a sigmoid output gate).
    virtual void mul(float* x, const float* y, int64_t n) = 0;
    // x[t][j] = scale[j] * softplus(x[t][j] + bias[j]) for x [n_tok][dim], softplus(v) = log(1 + e^v)
    // (v itself above 20, as torch's); the decay of a gated DeltaNet, -exp(A_log) * softplus(a + dt_bias),
    // with scale = GGUF's ssm_a.
    virtual void softplus_gate(float* x, const float* bias, const float* scale, int32_t n_tok, int32_t dim) = 0;
    // dst[r][0..width) = src[r][0..width) for n_rows rows, row r at dst + r * dst_stride and src +
    // r * src_stride floats: a column range of a fused projection's rows, or rows spread out or gathered.
    // The ranges do not overlap.
    virtual void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                           int64_t n_rows) = 0;
    // x[i] *= scale; then, with cap > 0, x[i] = cap * tanh(x[i] / cap) (Granite's logit and residual
    // scales, Gemma 2's final logit soft-capping).
    virtual void scale_softcap(float* x, int64_t n, float scale, float cap) = 0;
    // The gated delta rule of a gated DeltaNet layer (Qwen3.5, Qwen3-Next) over n_tok tokens of ONE
    // sequence, in order. q, k [n_tok][n_k_heads * head_k] as the projections give them: each head's
    // row is L2-normalized here (x / sqrt(sum x^2 + kDeltaRuleNormEps)), q's then scaled by
    // 1 / sqrt(head_k). v [n_tok][n_v_heads * head_v]; g (log of the decay, the caller's
    // -exp(A_log) * softplus(a + dt_bias)) and beta (the caller's sigmoid(b)) [n_tok][n_v_heads].
    // v head h reads q and k head h % n_k_heads: the tiled order GGUF files keep the v heads in.
    // state [n_v_heads][head_k][head_v] is the caller's buffer, read and updated in place; per token
    // and v head: S = exp(g) S; S += k (beta (v - S^T k))^T; out = S^T q.
    // out [n_tok][n_v_heads * head_v]; it aliases none of the inputs.
    virtual void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                  int32_t n_tok, const DeltaRuleShape& shape, float* state, float* out) = 0;
    // Causal depthwise convolution over time with a carried state (gated DeltaNet, Mamba2, LFM2):
    // x [n_tok][channels] of ONE sequence; state [kernel-1][channels] the previous kernel-1 inputs
    // (oldest first), read and updated in place (short_conv_state_floats); w [channels][kernel];
    // bias [channels] or null; y[t][c] = bias[c] + sum_j w[c][j] * xin[t + j][c] where xin = state
    // rows then x rows; then SiLU if `silu`. y [n_tok][channels] aliases none of the inputs.
    virtual void short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels,
                            int32_t kernel, bool silu, float* state, float* y) = 0;
    // Mamba2's selective scan (Nemotron-H, Granite 4) over n_tok tokens of ONE sequence, in order.
    // xbc [n_tok][shape.xbc_width()]: each token's x [n_head][head_dim], then B and C
    // [n_group][d_state] (the short convolution's output). dt [n_tok][n_head] the projection's time
    // steps; A (GGUF's ssm_a: -exp(A_log)), dt_bias (null: none) and D (the skip; null: none)
    // [n_head]. state [n_head][head_dim][d_state] (ssm_state_floats) is the caller's buffer, read and
    // updated in place; per token and head h, with x its head, B and C group h / (n_head / n_group):
    // d = softplus(dt + dt_bias); S = exp(d A) S + d x B^T; y = S C + D x.
    // y [n_tok][n_head * head_dim]; it aliases none of the inputs.
    virtual void ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                          int32_t n_tok, const SsmShape& shape, float* state, float* y) = 0;
    // y[t] = (x[t] - mean(x[t])) / sqrt(var(x[t]) + eps) * gamma (+ beta; null: none); y may be x.
    virtual void layernorm(const float* x, const float* gamma, const float* beta, int32_t n_tok, int32_t dim, float eps,
                           float* y) = 0;
    // x[i] = f(x[i]) in place.
    virtual void unary(UnaryOp f, float* x, int64_t n) = 0;
    // Bidirectional attention of an encoder, with no KV cache: q [n_tok][n_head * head_dim] and k, v
    // [n_tok][n_head_kv * head_dim] of the batch's tokens (set_batch), a sequence's tokens contiguous.
    // Token i attends to every token j of its own sequence (seq[j] == seq[i]), within shape.window
    // when that is > 0 (|pos[i] - pos[j]| < window); GQA as attention. out [n_tok][n_head * head_dim].
    virtual void encoder_attention(const float* q, const float* k, const float* v, int32_t n_tok,
                                   const AttentionShape& shape, float* out) = 0;

    // ---- fused ops: each default composes the primitives; a backend overrides the ones it can
    // do in fewer passes. Callers always call the fused op, so a fusion never depends on the
    // order in which a forward happens to call primitives. ----

    // residual != null: x += residual first (written back). Then y = rmsnorm(x) * gamma.
    virtual void add_rmsnorm(float* x, const float* residual, const float* gamma, int32_t n_tok, int32_t dim, float eps,
                             float* y) {
        if (residual) add(x, residual, (int64_t)n_tok * dim);
        rmsnorm(x, gamma, n_tok, dim, eps, y);
    }
    // y = W (rmsnorm(x += residual) * gamma); the normed rows go to xn. The output head.
    virtual void norm_matmul(float* x, const float* residual, const float* gamma, float eps, const Weight& w,
                             int32_t n_tok, float* xn, float* y) {
        add_rmsnorm(x, residual, gamma, n_tok, (int32_t)w.n_in, eps, xn);
        matmul(w, xn, n_tok, y);
    }
    // The attention input of a block: x += residual; xn = rmsnorm(x); q, k, v = projections (+
    // biases, + per-head norms of q and k); rope of q and k; k and v stored in kv. On return
    // b.q holds the rotated queries.
    virtual void attn_in(const AttnInWeights& w, float* x, const float* residual, int32_t n_tok, KVLayer& kv,
                         const BlockBuffers& b) {
        const int32_t dim = (int32_t)w.wq->n_in;
        add_rmsnorm(x, residual, w.norm, n_tok, dim, w.eps, b.xn);
        const Weight* ws[3] = {w.wq, w.wk, w.wv};
        float* ys[3] = {b.q, b.k, b.v};
        matmul_many(ws, ys, 3, b.xn, n_tok);
        const int32_t qw = w.n_head * w.head_dim, kw = w.n_head_kv * w.head_dim;
        if (w.bq) add_bias(b.q, w.bq, n_tok, qw);
        if (w.bk) add_bias(b.k, w.bk, n_tok, kw);
        if (w.bv) add_bias(b.v, w.bv, n_tok, kw);
        if (w.q_norm) head_rmsnorm(b.q, w.q_norm, n_tok, w.n_head, w.head_dim, w.eps);
        if (w.k_norm) head_rmsnorm(b.k, w.k_norm, n_tok, w.n_head_kv, w.head_dim, w.eps);
        if (w.rope) {
            rope(b.q, n_tok, w.n_head, *w.rope);
            rope(b.k, n_tok, w.n_head_kv, *w.rope);
            if (w.rope->temp_scale != 0.0f) attn_temperature(b.q, n_tok, qw, *w.rope);
        }
        kv_store(kv, b.k, b.v, n_tok);
    }
    // out = wo (attention of b.q over kv); b.att holds the attention output.
    virtual void attn_out(const KVLayer& kv, const AttentionShape& shape, const Weight& wo, int32_t n_tok,
                          const BlockBuffers& b, float* out) {
        attention(kv, b.q, n_tok, shape, b.att);
        matmul(wo, b.att, n_tok, out);
    }
    // A gated feed-forward: x += residual; xn = rmsnorm(x); out = down(act(gate xn) * up xn).
    virtual void ffn(const FfnWeights& w, float* x, const float* residual, int32_t n_tok, const BlockBuffers& b,
                     float* out) {
        add_rmsnorm(x, residual, w.norm, n_tok, (int32_t)w.gate->n_in, w.eps, b.xn);
        const Weight* ws[2] = {w.gate, w.up};
        float* ys[2] = {b.gate, b.up};
        matmul_many(ws, ys, 2, b.xn, n_tok);
        gated_act(w.act, b.gate, b.up, (int64_t)n_tok * w.gate->n_out, b.gate);
        matmul(*w.down, b.gate, n_tok, out);
    }

    // A mixture-of-experts feed-forward: x += residual; xn = rmsnorm(x); out = moe(xn).
    virtual void moe_ffn(const MoeWeights& w, float* x, const float* residual, int32_t n_tok, const BlockBuffers& b,
                         float* out) {
        add_rmsnorm(x, residual, w.norm, n_tok, (int32_t)w.router->n_in, w.eps, b.xn);
        moe(w, b.xn, n_tok, b, out);
    }
    // The experts on normed rows xn [n_tok][n_embd] (xn may be b.xn): each token's router picks
    // n_used experts as w.gating says; out[t] = sum over them of weight * down_e(act(gate_e xn[t])
    // * up_e xn[t]) (with the experts' biases), plus the shared expert. Callable on its own, so the
    // experts can run on another device than the block's attention.
    virtual void moe(const MoeWeights& w, const float* xn, int32_t n_tok, const BlockBuffers& b, float* out);

    // Step-graph hooks around this backend's ops of one forward step (after set_batch and the
    // input copies, before the output copy). step_begin returns true when it replayed a graph
    // recorded for `key` (same ops, same buffers): the caller then skips the ops and calls
    // step_end. Backends without graphs keep these defaults.
    virtual bool step_begin(uint64_t key) {
        (void)key;
        return false;
    }
    virtual void step_end() {}
    // Ends a step that threw between step_begin and step_end, dropping whatever it recorded.
    virtual void step_abort() {}

    // Runs work on this backend's host threads (the CPU backend's pool); null where it has none.
    virtual HostParallelFor host_parallel_for() { return nullptr; }

    // Staging for running host-resident blocks on this device; null where the backend cannot
    // (the CPU). Throws (OutOfMemory, InvalidInput) when the device cannot hold it.
    virtual std::unique_ptr<WeightStream> open_stream(const StreamSetup& setup) {
        (void)setup;
        return nullptr;
    }

protected:
    // moe's last part, in the default's order: out += the shared expert of xn (scaled by its gate),
    // in scratch of scratch_floats floats (it needs 2 * n_tok * n_ff_shared + n_tok * n_embd + 2 * n_tok;
    // fails naming the sizes otherwise). Nothing without one.
    void moe_shared_expert(const MoeWeights& w, const float* xn, int32_t n_tok, float* scratch, int64_t scratch_floats,
                           float* out);
};

}  // namespace ember
