// GLM-4 (0414) and GLM-Z1: RMSNorms before and after both attention and the feed-forward, Q, K, V
// biases, gate and up fused in one ffn_up (gate the first half) with SwiGLU, rope on adjacent pairs
// of each head's first rope.dimension_count dimensions (half the head in the releases).
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

class Glm4Arch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = false;
        check_experts(f, hp, /*allowed=*/false, /*required=*/false);
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        const int64_t E = hp.n_embd, F = hp.n_ff;
        const int64_t QW = (int64_t)hp.n_head * hp.head_dim, KW = (int64_t)hp.n_head_kv * hp.head_dim;
        return {
            {Role::attn_norm, "attn_norm.weight", {E}},
            {Role::wq, "attn_q.weight", {E, QW}},
            {Role::wk, "attn_k.weight", {E, KW}},
            {Role::wv, "attn_v.weight", {E, KW}},
            {Role::bq, "attn_q.bias", {QW}, true},
            {Role::bk, "attn_k.bias", {KW}, true},
            {Role::bv, "attn_v.bias", {KW}, true},
            {Role::wo, "attn_output.weight", {QW, E}},
            {Role::post_attn_norm, "post_attention_norm.weight", {E}},
            {Role::ffn_norm, "ffn_norm.weight", {E}},
            {Role::gate, "ffn_up.weight", {E, F}, false, false, {0, 2 * F}},
            {Role::up, "ffn_up.weight", {E, F}, false, false, {F, 2 * F}},
            {Role::down, "ffn_down.weight", {F, E}},
            {Role::post_ffn_norm, "post_ffw_norm.weight", {E}},
        };
    }
    const float* forward_block(const BlockRun& r) const override { return sandwich_norm_block(r, Activation::SiLU); }
};

const Architecture& glm4_architecture() {
    static const Glm4Arch arch;
    return arch;
}

}  // namespace ember
