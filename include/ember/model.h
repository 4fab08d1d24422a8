// Model loading (GGUF -> hyperparameters, weights bound in place, per-layer placement) and an
// inference context (paged KV cache + forward over batches of tokens).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/gguf.h"
#include "ember/tokenizer.h"

namespace ember {

// Defaults that more than one parameter struct (and the runner under them) share. ember's Python
// option table (python/ember/options.py) is tested against the structs, so the two cannot drift.
constexpr int32_t kDefaultKvBlockSize = 16;       // tokens per paged-KV block
constexpr int32_t kDefaultBatchTokens = 512;      // tokens of one forward
constexpr int32_t kDefaultKvGpuCacheMiB = 1024;   // GPU copies of host KV blocks (offload_kqv=false)

struct ModelParams {
    int32_t n_gpu_layers = 0;   // the last N blocks go on the GPU; -1 = all
    int32_t main_gpu = 0;
    // false: CPU-resident matrices are copied into anonymous huge-page memory at load instead of
    // being read from the file mapping (llama.cpp's --no-mmap).
    bool use_mmap = true;
    bool verbose = false;
    // Tensor overrides, llama.cpp's -ot: "REGEX=DEVICE" entries (DEVICE CPU or CUDA; an entry may
    // be a comma-separated list). The first pattern a tensor's name matches (regex search) decides
    // its device; these come before n_cpu_moe's and cpu_moe's. A block's attention and dense
    // tensors move together, and so do its MoE tensors (router, experts, shared expert).
    std::vector<std::string> override_tensor;
    bool cpu_moe = false;    // every block's routed experts on the CPU (--cpu-moe)
    int32_t n_cpu_moe = 0;   // the routed experts of the first N blocks on the CPU (--n-cpu-moe)
    // MiB of GPU memory for the weights: the experts of the first blocks move to the CPU until the
    // GPU's tensors fit. 0: free memory less 1 GiB, applied only when they would not fit; -1: off.
    int32_t moe_gpu_budget_mb = 0;
};

struct HParams {
    std::string arch;           // "llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "gpt-oss", ...
    int32_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_vocab = 0;
    int32_t head_dim = 0;       // n_embd / n_head unless the file says otherwise
    int32_t n_ctx_train = 0;
    float rms_eps = 1e-5f;
    float rope_base = 10000.0f;
    bool rope_neox = false;     // rotate halves (qwen2) instead of adjacent pairs (llama)
    bool tied_output = false;   // output head reuses token_embd
    // Rope scaling ({arch}.rope.scaling.*): "none", "linear" or "yarn"; llama 3's per-pair
    // frequency divisors come from the rope_freqs.weight tensor instead.
    std::string rope_scaling = "none";
    float rope_freq_scale = 1.0f;         // 1 / rope.scaling.factor
    int32_t rope_n_ctx_orig = 0;          // rope.scaling.original_context_length (YaRN)
    float yarn_ext_factor = 0.0f, yarn_attn_factor = 1.0f, yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
    bool yarn_rounded = true;   // YaRN's correction range rounded out to whole dimensions (not for gpt-oss)
    float yarn_log_mul = 0.0f;        // rope.scaling.yarn_log_multiplier: YaRN's mscale_all_dim (Mistral 3)
    float rope_attn_factor = 1.0f;    // rope.scaling.attn_factor: cos and sin scaled by it (LongRoPE)
    int32_t n_rot = 0;                // rope.dimension_count: each head's rotated dimensions (partial rotary)
    float attn_temp_scale = 0.0f;     // attention.temperature_scale (Mistral 3; its length rope_n_ctx_orig)
    int32_t attn_temp_length = 0;     // attention.temperature_length (llama 4's NoPE layers)
    float logit_mult = 1.0f;          // Command R: logits times {arch}.logit_scale
    // Sliding-window attention: layers for which swa_layer[l] is true see the last n_swa
    // positions only and rotate with rope_base_swa (Gemma 3's local layers).
    int32_t n_swa = 0;
    float rope_base_swa = 10000.0f;
    std::vector<bool> swa_layer;
    float attn_scale = 0.0f;    // > 0: the file's query scale ({arch}.attention.scale), else 1/sqrt(head_dim)
    // Gemma 2's soft-capping of attention scores and of the logits (0: none).
    float attn_softcap = 0.0f, final_softcap = 0.0f;
    // Granite's muP multipliers: embeddings times embedding_scale (0: the architecture's own), each
    // block's attention and feed-forward outputs times residual_scale, logits divided by logit_scale.
    float embedding_scale = 0.0f, residual_scale = 1.0f, logit_scale = 1.0f;
    // Q, K and V stored as one attn_qkv.weight (nomic-bert as llama.cpp's converter writes it).
    bool qkv_fused = false;
    // Mixture of experts ({arch}.expert_count, expert_used_count): n_expert 0 for a dense model.
    int32_t n_expert = 0, n_expert_used = 0;
    int32_t n_ff_exp = 0;              // an expert's width: expert_feed_forward_length, else feed_forward_length
    bool expert_weights_norm = true;   // the chosen experts' weights renormalized to sum 1 (expert_weights_norm)
    float expert_weights_scale = 1.0f; // and then scaled by this (expert_weights_scale)
    // Hybrid models (Qwen3.5): recurrent_layer[l] marks the gated DeltaNet layers, which keep a
    // per-sequence state instead of KV (empty: none). Their shapes ({arch}.ssm.*): the convolution
    // kernel, the q/k heads (group_count) and v heads (time_step_rank), and the head widths
    // (state_size; inner_size / v heads).
    std::vector<bool> recurrent_layer;
    int32_t ssm_conv_kernel = 0, ssm_k_heads = 0, ssm_v_heads = 0, ssm_head_k = 0, ssm_head_v = 0;
    // Multi-token-prediction blocks stored after the n_layer blocks ({arch}.nextn_predict_layers):
    // loaded by llama.cpp for drafting, not run here.
    int32_t n_layer_nextn = 0;
    // Multi-head latent attention (DeepSeek V2/V3, {arch}.attention.*): queries through a q_lora_rank
    // bottleneck (0: none), keys and values from a kv_lora_rank latent; a head's key has qk_nope + n_rot
    // dimensions (key_length_mla) and its value v_head_dim (value_length_mla). The cache keeps one KV head
    // of head_dim = n_rot + kv_lora_rank a token. 0: not such a model.
    int32_t q_lora_rank = 0, kv_lora_rank = 0, mla_head_dim_k = 0, mla_head_dim_v = 0;
    bool kv_values_are_keys = false;   // the cache keeps one row a token, read as key and value (KVLayer::v == k)
    int32_t n_layer_dense_lead = 0;   // leading_dense_block_count: the first layers' feed-forwards are dense
    int32_t n_expert_shared = 0;      // expert_shared_count: shared experts, one of n_ff_exp * this wide
    // Group-limited routing (expert_group_count, expert_group_used_count): a token's experts come from its
    // n_group_used best groups of n_expert / n_expert_groups; 0 or 1 group: none.
    int32_t n_expert_groups = 0, n_group_used = 0;
    bool expert_sigmoid = false;      // expert_gating_func 2: sigmoid scores, else softmax
    // Per-layer attention geometry where layers differ (Gemma 4's global layers have a head size and
    // KV heads of their own); empty: n_head_kv heads of head_dim in every layer.
    std::vector<int32_t> n_head_kv_layer, head_dim_layer;
    // Per-layer feed-forward widths where they differ (Gemma 4's double-wide KV-sharing layers); empty: n_ff.
    std::vector<int32_t> n_ff_layer;
    int32_t n_rot_swa = 0;   // rope.dimension_count_swa: the sliding layers' rotated dimensions (Gemma 4)
    // kv_from[l] >= 0: layer l keeps no KV and attends over that earlier layer's (KV shared between
    // layers: Gemma 4); empty or -1: its own.
    std::vector<int32_t> kv_from;
    // Per-layer embeddings (Gemma 4): each layer's input of this width from per_layer_token_embd; 0: none.
    int32_t n_embd_per_layer = 0;
    // [n_layer] the hidden state's factor after each block (Gemma 4's layer_scalar); empty: none.
    std::vector<float> layer_scale;
    int32_t layer_n_head_kv(int32_t l) const { return n_head_kv_layer.empty() ? n_head_kv : n_head_kv_layer[l]; }
    int32_t layer_head_dim(int32_t l) const { return head_dim_layer.empty() ? head_dim : head_dim_layer[l]; }
    int32_t layer_n_ff(int32_t l) const { return n_ff_layer.empty() ? n_ff : n_ff_layer[l]; }
    int32_t kv_layer(int32_t l) const { return kv_from.empty() || kv_from[l] < 0 ? l : kv_from[l]; }
    // Floats of K (and of V) a token takes in layer l's cache: 0 for a layer reading another's.
    int64_t kv_width(int32_t l) const { return kv_layer(l) != l ? 0 : (int64_t)layer_n_head_kv(l) * layer_head_dim(l); }
};

struct ModelImpl;

class Model {
public:
    // Throws InvalidInput naming the file and the key/tensor that is missing or malformed.
    static std::shared_ptr<Model> load(const std::string& path, const ModelParams& params);
    ~Model();
    const HParams& hparams() const;
    const Tokenizer& tokenizer() const;
    const GGUFFile& file() const;
    const ModelParams& params() const;
    ModelImpl& impl() { return *impl_; }

private:
    Model() = default;
    std::unique_ptr<ModelImpl> impl_;
};

struct ContextParams {
    int32_t n_ctx = 512;          // tokens of KV per sequence
    int32_t n_batch = kDefaultBatchTokens;        // prompt tokens per forward
    int32_t n_threads = 0;                        // 0: all hardware threads
    int32_t kv_block_size = kDefaultKvBlockSize;
    bool offload_kqv = true;      // false: KV of GPU layers stays in host memory
    // With offload_kqv=false: MiB of GPU memory that keep copies of the host KV blocks each step
    // reads, so they need not cross PCIe again (0: none).
    int32_t kv_gpu_cache_mb = kDefaultKvGpuCacheMiB;
    // KV cache element types of K and V, each on its own as llama.cpp's -ctk / -ctv: F16; Q8_0
    // (half the bytes, needs head_dim % 32 == 0); F32 (CPU blocks only: exact comparisons with
    // f32 references).
    GGMLType type_k = GGMLType::F16;
    GGMLType type_v = GGMLType::F16;
    // Embeddings instead of logits: eval keeps each token's hidden state after the final norm
    // (embeddings(i)); logits(i) is then unavailable. Pooling is the caller's (ember.Llama's).
    bool embeddings = false;
    // Hybrid models (recurrent layers): the sequence's recurrent state is kept every
    // state_snapshot_interval tokens (0: never), within state_snapshot_mb MiB of host memory (the
    // oldest dropped first), so a prompt sharing a prefix resumes from the last snapshot in it
    // instead of from the start.
    int32_t state_snapshot_interval = 128;
    int32_t state_snapshot_mb = 1024;
};

struct ContextImpl;

class Context {
public:
    Context(std::shared_ptr<Model> model, const ContextParams& params);
    ~Context();
    // Appends tokens to the sequence at positions n_past()..., in n_batch chunks.
    // logits_all: keep logits for every token of this call, else only for the last one.
    // Throws InvalidInput if the sequence would exceed n_ctx or a token id is out of range.
    void eval(const int32_t* tokens, int32_t n, bool logits_all);
    // Logits of token i of the last eval (i < 0 counts from the end); [n_vocab] floats.
    const float* logits(int32_t i = -1) const;
    int32_t n_logits() const;
    // With ContextParams::embeddings: the normed hidden state of token i of the last eval (i < 0
    // counts from the end; logits_all decides which tokens have one, as for logits); [n_embd] floats.
    const float* embeddings(int32_t i = -1) const;
    int32_t n_past() const;
    void truncate(int32_t n_past);   // forget the KV of positions >= n_past
    // Tokens run through the model since the context was made: evaluated ones, and those a hybrid
    // model's truncate evaluated again.
    int64_t n_evaluated() const;
    int32_t n_ctx() const;
    const Model& model() const;

private:
    std::unique_ptr<ContextImpl> impl_;
};

}  // namespace ember
