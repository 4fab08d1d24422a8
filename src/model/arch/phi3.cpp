// Phi-3 and Phi-4: the pre-norm llama block with Q, K, V fused in one attn_qkv matrix and gate and
// up in one ffn_up (gate the first half), neox rope over the first rope.dimension_count dimensions
// of each head, LongRoPE (rope_factors_short/long with an attention factor), and a sliding window
// over every layer where the file sets one (phi3.attention.sliding_window > 0).
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

class Phi3Arch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = true;
        check_experts(f, hp, /*allowed=*/false, /*required=*/false);
        hp.n_swa = (int32_t)f.get_uint("phi3.attention.sliding_window", 0);
        hp.swa_layer.assign(hp.n_layer, hp.n_swa > 0);
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        const int64_t E = hp.n_embd, F = hp.n_ff;
        const int64_t QW = (int64_t)hp.n_head * hp.head_dim, KW = (int64_t)hp.n_head_kv * hp.head_dim;
        const int64_t QKV = QW + 2 * KW;
        return {
            {Role::attn_norm, "attn_norm.weight", {E}},
            {Role::wq, "attn_qkv.weight", {E, QW}, false, false, {0, QKV}},
            {Role::wk, "attn_qkv.weight", {E, KW}, false, false, {QW, QKV}},
            {Role::wv, "attn_qkv.weight", {E, KW}, false, false, {QW + KW, QKV}},
            {Role::wo, "attn_output.weight", {QW, E}},
            {Role::ffn_norm, "ffn_norm.weight", {E}},
            {Role::gate, "ffn_up.weight", {E, F}, false, false, {0, 2 * F}},
            {Role::up, "ffn_up.weight", {E, F}, false, false, {F, 2 * F}},
            {Role::down, "ffn_down.weight", {F, E}},
        };
    }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        if (hp.swa_layer[l]) c.shape.window = hp.n_swa;
        return c;
    }
    const float* forward_block(const BlockRun& r) const override { return pre_norm_block(r, Activation::SiLU); }
};

const Architecture& phi3_architecture() {
    static const Phi3Arch arch;
    return arch;
}

}  // namespace ember
