// What an architecture is to the rest of ember: its hyperparameter keys, the tensors of a block
// (by role, optional ones marked), each layer's rope and attention shape, and its block forward
// over the backend contract. One file per architecture implements this (llama.cpp, qwen2.cpp, ...)
// and registry.cpp maps general.architecture names to them.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ember/model.h"

namespace ember {

// The roles a block's tensors play. Matrices (2-D) and stacked experts (3-D) become Weights,
// vectors (1-D, or 2-D where the spec says so) float arrays.
enum class Role : int {
    attn_norm,
    wq,
    wk,
    wv,
    wo,
    bq,
    bk,
    bv,
    q_norm,
    k_norm,
    post_attn_norm,
    ffn_norm,
    gate,
    up,
    down,
    post_ffn_norm,
    bo,               // attention output bias (gpt-oss)
    attn_sinks,       // per-head sink logits [n_head] (gpt-oss)
    router,           // a mixture's router [n_expert][n_embd]
    router_bias,
    gate_exps,        // stacked experts [n_expert][n_ff][n_embd] (up_exps alike; down_exps [n_expert][n_embd][n_ff])
    up_exps,
    down_exps,
    gate_exps_bias,   // [n_expert][n_ff] as one float array (down_exps_bias [n_expert][n_embd])
    up_exps_bias,
    down_exps_bias,
    post_attn_norm_b, // LayerNorm biases of the post-norm encoders (BERT's attn_output_norm, layer_output_norm)
    post_ffn_norm_b,
    up_b,             // non-gated feed-forward biases (BERT)
    down_b,
    gate_shexp, // a mixture's shared expert, every token's (llama 4): [n_ff_exp][n_embd] (down [n_embd][n_ff_exp])
    up_shexp,
    down_shexp,
    gate_inp_shexp, // [n_embd] -> 1: the shared expert's output is scaled by sigmoid of it (Qwen3.5-MoE, Qwen3-Next)
    exp_probs_b, // [n_expert] a mixture's selection bias (DeepSeek V3's e_score_correction_bias)
    ssm_in, // a gated DeltaNet layer (Qwen3.5): q, k, v projection [n_embd] -> [2 key_dim + value_dim]
    ssm_gate, // its output gate z [n_embd] -> [value_dim]
    ssm_conv, // its depthwise convolution [channels][kernel], read as floats
    ssm_dt, // [n_v_heads] added to alpha before the softplus
    ssm_a, // [n_v_heads] -exp(A_log)
    ssm_beta, // [n_embd] -> [n_v_heads]
    ssm_alpha, // [n_embd] -> [n_v_heads]
    ssm_norm, // [head_v] RMSNorm of each v head's output
    ssm_out, // [value_dim] -> [n_embd]
    ssm_conv_b, // a Mamba2 layer (Nemotron-H, Granite 4): its convolution's bias [channels], and the skip D
    ssm_d, // [n_head] (its other tensors take the roles above: ssm_in xBC, ssm_gate z, ssm_alpha dt)
    ple_gate, // per-layer embeddings (Gemma 4): the gate [n_embd] -> [n_embd_per_layer] of the layer's input,
    ple_proj, // its projection back [n_embd_per_layer] -> [n_embd], the norm after it,
    ple_post_norm,
    ple_model_proj, // and this layer's rows of the model's per_layer_model_proj, with per_layer_proj_norm
    ple_model_norm,
    mla_q_a, // multi-head latent attention (DeepSeek V2/V3): the queries' down projection [n_embd] -> [q_lora_rank],
    mla_q_a_norm, // its norm, the up projection [q_lora_rank] -> [n_head * (qk_nope + qk_rope)],
    mla_q_b,
    mla_kv_a, // [n_embd] -> [kv_lora_rank + qk_rope]: the latent and the shared rotated key, the latent's norm,
    mla_kv_a_norm,
    mla_k_b, // per head [n_head][kv_lora_rank][qk_nope] (the latent's key projection, transposed: queries go
    mla_v_b, // through it) and [n_head][v_head_dim][kv_lora_rank] (its value projection), stacked 3-D
    router_scale, // Gemma 4's mixture: the router's input scale [n_embd], each expert's output scale [n_expert],
    down_exps_scale,
    ffn_norm_2, // the norm before the experts, and the norms after the dense MLP and after the experts
    post_ffn_norm_1,
    post_ffn_norm_2,
    count
};
constexpr int kRoles = static_cast<int>(Role::count);

// Rows [first, first + shape[1]) of a matrix the file stores with `of` rows: one part of a fused
// tensor (Phi-3's attn_qkv, the gate and up halves of a fused ffn_up). of 0: the whole tensor.
struct RowSlice {
    int64_t first = 0, of = 0;
};

struct TensorSpec {
    Role role;
    const char* name; // after "blk.N.", e.g. "attn_q.weight"
    std::vector<int64_t> shape; // GGUF ne order: [n_in, n_out] for matrices
    bool optional = false;
    bool vector = false; // a 2-D tensor read as one float array (the experts' biases)
    RowSlice slice{};
    bool global = false; // a model-level tensor (no "blk.N." prefix) every block binds (or a slice of)
};

// A block's GGUF tensors (null where an optional one is absent).
struct BlockTensors {
    std::array<const GGUFTensor*, kRoles> t{};
    std::array<bool, kRoles> vector{}; // read as floats whatever its dimensions (TensorSpec::vector)
    const GGUFTensor* operator[](Role r) const { return t[static_cast<int>(r)]; }
    // Whether role r's tensor becomes a Weight (else a float array).
    bool matrix(int r) const { return t[r] && t[r]->ne.size() >= 2 && !vector[r]; }
};

// A block's tensors as one backend sees them.
struct BlockWeights {
    Backend* backend = nullptr;
    std::array<Weight, kRoles> mat{};
    std::array<const float*, kRoles> vec{};
    const Weight* m(Role r) const { return &mat[static_cast<int>(r)]; }
    const float* v(Role r) const { return vec[static_cast<int>(r)]; }
};

struct RemoteExperts;

// How one layer attends: its rope and its attention shape (scale, sliding window, soft-cap).
struct LayerConfig {
    RopeParams rope;
    bool use_rope = true; // false: a NoPE layer, q and k not rotated (SmolLM3)
    AttentionShape shape{};
    float out_scale = 1.0f; // the hidden state's factor after the block (Gemma 4's layer_scalar)
};

// What the head does to the logits after the output matrix: times scale, then soft-capped to
// softcap * tanh(x / softcap) where softcap > 0 (Backend::scale_softcap).
struct LogitMap {
    float scale = 1.0f, softcap = 0.0f;
};

// One block's run: the hidden state x [n_tok][n_embd] with the previous block's output still to
// be added (residual, null for none), two [n_tok][n_embd] buffers the block may write, and the
// scratch of the fused ops. A block returns its own output, which becomes the next residual.
struct BlockRun {
    Backend& be;
    const BlockWeights& w;
    const LayerConfig& cfg;
    const HParams& hp;
    KVLayer& kv;
    const BlockBuffers& buf;
    int32_t n_tok;
    float* x;
    const float* residual;
    float* out_a;
    float* out_b;
    // The block's experts on another backend (remote_experts.h); null: they run on be with the rest.
    const RemoteExperts* experts = nullptr;
    // A recurrent layer's state slots (null for attention layers) and the step's batch, whose
    // state_slot says each sequence's slot.
    const RecurrentLayer* state = nullptr;
    const BatchInfo* batch = nullptr;
    // Per-layer embeddings (hp.n_embd_per_layer > 0): the step's input embeddings [n_tok][n_embd] (after
    // embd_scale) and this layer's rows of per_layer_token_embd [n_tok][n_embd_per_layer], which the
    // block may overwrite; null otherwise.
    const float* embd = nullptr;
    float* per_layer = nullptr;
};

class Architecture {
public:
    virtual ~Architecture() = default;
    // Reads the architecture's own keys after the common ones (ember reads those for all).
    virtual void read_hparams(const GGUFFile& f, HParams& hp) const { (void)f, (void)hp; }
    virtual std::vector<TensorSpec> block_tensors(const HParams& hp) const = 0;
    // Layer l's tensors: block_tensors unless layers differ in kind (hybrid models).
    virtual std::vector<TensorSpec> layer_tensors(const HParams& hp, int32_t l) const {
        (void)l;
        return block_tensors(hp);
    }
    // Whether layer l attends (keeps KV) and whether it has a feed-forward, which the file's per-layer
    // head_count_kv and feed_forward_length must then not give as 0 (llama.cpp's hybrid files write 0
    // for a layer without that part). By default every layer but a recurrent one attends, and every
    // layer has a feed-forward.
    virtual bool layer_attends(const HParams& hp, int32_t l) const {
        return l >= (int32_t)hp.recurrent_layer.size() || !hp.recurrent_layer[l];
    }
    virtual bool layer_has_ffn(const HParams& hp, int32_t l) const {
        (void)hp, (void)l;
        return true;
    }
    // Factor the embedding rows are scaled by before block 0.
    virtual float embd_scale(const HParams& hp) const {
        (void)hp;
        return 1.0f;
    }
    // Layer l's rope and attention; `rope` is the model's rope (base, scaling, frequency factors).
    virtual LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const;
    // Runs the block on r.be; returns its output (r.out_a or r.out_b), still to be added to x, or
    // null when the block left its output in x itself (the post-norm encoders).
    virtual const float* forward_block(const BlockRun& r) const = 0;
    // The head's map of the logits (Granite's logit scale, Gemma 2's final soft-cap); none by default.
    virtual LogitMap logit_map(const HParams& hp) const {
        (void)hp;
        return {};
    }
    // Why this file of the architecture runs on the CPU only so far, or empty where it runs on every
    // backend: a placement with blocks on the GPU is refused at load with this reason (plan_placement).
    virtual std::string cpu_only(const GGUFFile& f) const {
        (void)f;
        return {};
    }
    // Floats per token of BlockBuffers::recurrent a recurrent layer's mixer works in (its projections
    // and the convolution's and scan's outputs, in the layer's backend memory); 0: none.
    virtual int64_t recurrent_scratch_floats(const HParams& hp) const {
        (void)hp;
        return 0;
    }
    // Why a GPU block's routed experts cannot run apart from it on the CPU (cpu_moe, n_cpu_moe, an override,
    // the GPU budget), or null where they can: plan_placement refuses such a placement at load with this
    // reason, and its GPU budget leaves these experts with their blocks.
    virtual const char* experts_stay_with_block() const { return nullptr; }
    // Encoders (encoder_arch.h) attend bidirectionally and keep no KV cache: Encoder runs them, not Runner.
    virtual bool encoder() const { return false; }
    // The final norm is a LayerNorm without bias (Command R), not an RMSNorm.
    virtual bool layernorm_head() const { return false; }
    // The final norm's tensor (LFM2's files call it token_embd_norm.weight).
    virtual const char* output_norm_name() const { return "output_norm.weight"; }
};

// The architecture of general.architecture `name`; throws naming the file and the ones supported.
const Architecture& find_architecture(const std::string& name, const std::string& path);

} // namespace ember
