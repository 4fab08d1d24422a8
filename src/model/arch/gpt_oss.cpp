// gpt-oss: pre-norm blocks with Q/K/V/O biases, per-head attention sinks, neox rope with YaRN,
// sliding-window layers (the even ones) alternating with full ones, and a mixture of experts with
// biases everywhere: the router's logits plus its bias, a softmax over the chosen experts only,
// and gpt-oss's clamped SwiGLU. GGUF conventions are llama.cpp's (the norm before the experts is
// post_attention_norm).
#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

class GptOssArch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = true;
        hp.yarn_rounded = false;
        check_experts(f, hp, /*allowed=*/true, /*required=*/true);
        hp.n_swa = (int32_t)f.get_uint("gpt-oss.attention.sliding_window");
        if (hp.n_swa <= 0) fail(f.path(), ": gpt-oss.attention.sliding_window must be positive, got ", hp.n_swa);
        // llama.cpp's gpt-oss pattern: layer l attends within the window when l is even.
        hp.swa_layer.assign(hp.n_layer, false);
        for (int32_t l = 0; l < hp.n_layer; l += 2) hp.swa_layer[l] = true;
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        const int64_t E = hp.n_embd, D = hp.head_dim;
        const int64_t QW = (int64_t)hp.n_head * D, KW = (int64_t)hp.n_head_kv * D;
        std::vector<TensorSpec> t = {
            {Role::attn_norm, "attn_norm.weight", {E}},
            {Role::wq, "attn_q.weight", {E, QW}},
            {Role::bq, "attn_q.bias", {QW}},
            {Role::wk, "attn_k.weight", {E, KW}},
            {Role::bk, "attn_k.bias", {KW}},
            {Role::wv, "attn_v.weight", {E, KW}},
            {Role::bv, "attn_v.bias", {KW}},
            {Role::wo, "attn_output.weight", {QW, E}},
            {Role::bo, "attn_output.bias", {E}},
            {Role::attn_sinks, "attn_sinks.weight", {hp.n_head}},
            {Role::ffn_norm, "post_attention_norm.weight", {E}},
        };
        for (TensorSpec& s : moe_block_tensors(hp, /*biases=*/true)) t.push_back(std::move(s));
        return t;
    }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        if (hp.swa_layer[l]) c.shape.window = hp.n_swa;
        return c;
    }
    const float* forward_block(const BlockRun& r) const override {
        r.be.attn_in(attn_in_weights(r), r.x, r.residual, r.n_tok, r.kv, r.buf);
        // The sinks live with the block's weights, on its backend.
        AttentionShape shape = r.cfg.shape;
        shape.sinks = r.w.v(Role::attn_sinks);
        r.be.attn_out(r.kv, shape, *r.w.m(Role::wo), r.n_tok, r.buf, r.out_a);
        r.be.add_bias(r.out_a, r.w.v(Role::bo), r.n_tok, r.hp.n_embd);
        run_moe_ffn(r, MoeConfig{MoeGating::topk_softmax, Activation::SwiGLUClamped}, r.out_a, r.out_b);
        return r.out_b;
    }
};

const Architecture& gpt_oss_architecture() {
    static const GptOssArch arch;
    return arch;
}

}  // namespace ember
