// DeepSeek V2 / V3 (deepseek2: also Kimi K2 and GLM-4.7-Flash files): latent attention (mla.h) and,
// after the first leading_dense_block_count dense layers, a mixture with shared experts: softmax
// routing (V2) or sigmoid routing with a selection bias, group-limited choice and a routed scale
// (V3). YaRN as llama.cpp's deepseek2: cos and sin keep their magnitude, the attention scale takes
// mscale_all_dim's factor squared.
#include <cmath>

#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/mla.h"
#include "model/arch/moe_common.h"
#include "model/remote_experts.h"

namespace ember {

namespace {

// The vocabulary as llama.cpp's loader counts it for its guesses: vocab_size, else the tokenizer's tokens.
int64_t file_vocab(const GGUFFile& f, const std::string& a) {
    if (f.find(a + "vocab_size")) return (int64_t)f.get_uint(a + "vocab_size");
    if (const GGUFValue* tokens = f.find("tokenizer.ggml.tokens")) return (int64_t)tokens->arr.size();
    const GGUFTensor* embd = f.find_tensor("token_embd.weight");
    return embd && embd->ne.size() == 2 ? embd->ne[1] : 0;
}

// Files written before expert_gating_func existed: as llama.cpp, GLM-4.7-Flash's shape (47 or 48 trunk
// layers, 154880 tokens) routes by sigmoid, the DeepSeek V2 / V2.5 files by softmax. A selection bias
// outside that shape belongs to a sigmoid-routed model the shape does not name: refused, not guessed.
uint64_t guessed_gating(const GGUFFile& f, const std::string& a, const HParams& hp) {
    if ((hp.n_layer == 47 || hp.n_layer == 48) && file_vocab(f, a) == 154880) return 2;
    for (int32_t l = hp.n_layer_dense_lead; l < hp.n_layer; ++l)
        if (f.find_tensor("blk." + std::to_string(l) + ".exp_probs_b.bias"))
            fail(f.path(), ": ", a, "expert_gating_func is missing and the experts have a selection bias ",
                 "(exp_probs_b), which softmax-routed DeepSeek V2 files never have; the routing cannot be told ",
                 "from the file: convert the checkpoint again (ember-convert or llama.cpp's current converter)");
    return 1;
}

void read_routing(const GGUFFile& f, const std::string& a, HParams& hp) {
    hp.n_layer_dense_lead = (int32_t)f.get_uint(a + "leading_dense_block_count", 0);
    if (hp.n_layer_dense_lead < 0 || hp.n_layer_dense_lead > hp.n_layer)
        fail(f.path(), ": ", a, "leading_dense_block_count ", hp.n_layer_dense_lead, " exceeds block_count ",
             hp.n_layer);
    hp.n_expert_shared = (int32_t)f.get_uint(a + "expert_shared_count", 0);
    // llama.cpp's converter writes the key only when the weights are renormalized.
    hp.expert_weights_norm = f.get_bool(a + "expert_weights_norm", false);
    uint64_t gating = f.get_uint(a + "expert_gating_func", 0);   // 0: none given, as llama.cpp reads it
    if (gating == 0) gating = guessed_gating(f, a, hp);
    if (gating != 1 && gating != 2)
        fail(f.path(), ": ", a, "expert_gating_func ", gating, " is not supported (1 softmax, 2 sigmoid)");
    hp.expert_sigmoid = gating == 2;
    hp.n_expert_groups = (int32_t)f.get_uint(a + "expert_group_count", 0);
    hp.n_group_used = (int32_t)f.get_uint(a + "expert_group_used_count", (uint64_t)hp.n_expert_groups);
    if (hp.n_expert_groups > 1) {
        const int32_t per = hp.n_expert / hp.n_expert_groups;
        if (hp.n_expert % hp.n_expert_groups != 0 || hp.n_group_used < 1 || hp.n_group_used > hp.n_expert_groups ||
            hp.n_expert_used > hp.n_group_used * per)
            fail(f.path(), ": ", a, "expert_group_count ", hp.n_expert_groups, " and expert_group_used_count ",
                 hp.n_group_used, " must split expert_count ", hp.n_expert, " evenly and leave expert_used_count ",
                 hp.n_expert_used, " experts to choose from");
    }
}

// As llama.cpp: the rope's magnitude is the file's attn_factor (mscale taken equal to mscale_all_dim,
// the file's yarn_log_multiplier / 0.1), and the scores are scaled by (1 + 0.1 mscale_all_dim ln factor)^2.
void read_yarn(const GGUFFile& f, const std::string& a, HParams& hp) {
    hp.attn_scale = 1.0f / std::sqrt((float)hp.mla_head_dim_k);
    if (hp.rope_scaling != "yarn") return;
    const double ln = std::log(1.0 / hp.rope_freq_scale);
    const double m_all = f.get_float(a + "rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
    const double magnitude = (m_all != 0.0 ? 1.0 : 1.0 + 0.1 * ln) * hp.rope_attn_factor;
    hp.yarn_attn_factor = (float)(magnitude / (1.0 + 0.1 * ln));
    hp.yarn_log_mul = 0.0f;
    const double mscale = magnitude * (1.0 + 0.1 * m_all * ln);
    hp.attn_scale = (float)(mscale * mscale / std::sqrt((double)hp.mla_head_dim_k));
}

}  // namespace

class Deepseek2Arch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        const std::string a = hp.arch + ".";
        hp.rope_neox = false;
        check_experts(f, hp, /*allowed=*/true, /*required=*/true);
        if (f.find_tensor("blk.0.attn_kv_b.weight") && !f.find_tensor("blk.0.attn_k_b.weight"))
            fail(f.path(), ": a deepseek2 file with attn_kv_b (an older conversion) and no attn_k_b / attn_v_b; ",
                 "convert the checkpoint again (ember-convert or llama.cpp's current converter)");
        if (!f.find(a + "attention.kv_lora_rank")) fail(f.path(), ": ", a, "attention.kv_lora_rank is missing");
        hp.kv_lora_rank = (int32_t)f.get_uint(a + "attention.kv_lora_rank");
        hp.q_lora_rank = (int32_t)f.get_uint(a + "attention.q_lora_rank", 0);
        for (const char* key : {"attention.key_length_mla", "attention.value_length_mla"})
            if (!f.find(a + key)) fail(f.path(), ": ", a, key, " is missing");
        hp.mla_head_dim_k = (int32_t)f.get_uint(a + "attention.key_length_mla");
        hp.mla_head_dim_v = (int32_t)f.get_uint(a + "attention.value_length_mla");
        check_mla_hparams(f, hp);
        hp.kv_values_are_keys = true;   // each head's value is its cached row (mla.h)
        if (f.get_float(a + "attention.temperature_scale", 0.0) != 0.0)
            fail(f.path(), ": ", a, "attention.temperature_scale is not supported for deepseek2");
        // Multi-token-prediction blocks (GLM-4.7-Flash files) follow the trunk's and are not run.
        hp.n_layer_nextn = (int32_t)f.get_uint(a + "nextn_predict_layers", 0);
        if (hp.n_layer_nextn < 0 || hp.n_layer_nextn >= hp.n_layer)
            fail(f.path(), ": ", a, "nextn_predict_layers ", hp.n_layer_nextn, " must be below block_count ",
                 hp.n_layer);
        hp.n_layer -= hp.n_layer_nextn;
        read_routing(f, a, hp);
        read_yarn(f, a, hp);
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override { return layer_tensors(hp, 0); }
    std::vector<TensorSpec> layer_tensors(const HParams& hp, int32_t l) const override {
        const int64_t E = hp.n_embd, F = hp.n_ff, S = (int64_t)hp.n_ff_exp * hp.n_expert_shared;
        std::vector<TensorSpec> t = mla_tensors(hp);
        t.push_back({Role::ffn_norm, "ffn_norm.weight", {E}});
        if (l < hp.n_layer_dense_lead) {
            t.push_back({Role::gate, "ffn_gate.weight", {E, F}});
            t.push_back({Role::up, "ffn_up.weight", {E, F}});
            t.push_back({Role::down, "ffn_down.weight", {F, E}});
            return t;
        }
        for (TensorSpec& s : moe_block_tensors(hp, /*biases=*/false)) t.push_back(std::move(s));
        t.push_back({Role::exp_probs_b, "exp_probs_b.bias", {(int64_t)hp.n_expert}, /*optional=*/true});
        if (S > 0) {
            t.push_back({Role::gate_shexp, "ffn_gate_shexp.weight", {E, S}});
            t.push_back({Role::up_shexp, "ffn_up_shexp.weight", {E, S}});
            t.push_back({Role::down_shexp, "ffn_down_shexp.weight", {S, E}});
        }
        return t;
    }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        (void)l;
        LayerConfig c;
        c.rope = rope;   // each head_dim-wide row rotates its first n_rot dimensions
        c.shape = AttentionShape{hp.n_head, 1, hp.head_dim, hp.attn_scale, 0};
        return c;
    }
    // The cache's row (the latent and the rotated key part) is one attention head on the GPU, whose
    // kernels take heads of up to kGpuMaxHeadDim values.
    std::string cpu_only(const GGUFFile& f) const override {
        const uint64_t row = f.get_uint(f.get_string("general.architecture") + ".attention.key_length", 0);
        if (row <= (uint64_t)kGpuMaxHeadDim) return {};
        return "its cached latent rows of " + std::to_string(row) + " values (kv_lora_rank + the rope part) are " +
               "wider than the " + std::to_string(kGpuMaxHeadDim) + " of the GPU's attention heads";
    }
    const float* forward_block(const BlockRun& r) const override {
        mla_attention(r, r.out_a);
        if (!r.w.m(Role::router)->data) {
            r.be.ffn(ffn_weights(r, Activation::SiLU), r.x, r.out_a, r.n_tok, r.buf, r.out_b);
            return r.out_b;
        }
        const BlockWeights& w = r.experts ? r.experts->w : r.w;
        const MoeGating gating = r.hp.expert_sigmoid ? MoeGating::sigmoid : MoeGating::softmax;
        MoeWeights m = moe_weights(w, r.hp, MoeConfig{gating, Activation::SiLU});
        m.norm = w.v(Role::ffn_norm);
        m.eps = r.hp.rms_eps;
        m.selection_bias = w.v(Role::exp_probs_b);
        m.norm_topk = r.hp.expert_weights_norm;
        m.n_group = r.hp.n_expert_groups, m.n_group_used = r.hp.n_group_used;
        if (r.experts) moe_ffn_remote(r, m, r.out_a, r.out_b);
        else r.be.moe_ffn(m, r.x, r.out_a, r.n_tok, r.buf, r.out_b);
        return r.out_b;
    }
};

const Architecture& deepseek2_architecture() {
    static const Deepseek2Arch arch;
    return arch;
}

}  // namespace ember
