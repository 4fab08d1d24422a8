// Command R (command-r) and Command R7B / Command A (cohere2): one LayerNorm (mean-subtracting, no
// bias) feeds attention and the SwiGLU feed-forward side by side, whose outputs both add to the
// residual; rope on adjacent pairs; a LayerNorm before the tied head, whose logits are scaled by
// logit_scale. cohere2 slides a window over three layers of each four (the fourth global, without
// rope). Command R+ files add a LayerNorm of each head of q and k, with a weight of its own per
// head, before rope.
#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

class CohereArch final : public Architecture {
public:
    explicit CohereArch(bool cohere2) : cohere2_(cohere2), a_(cohere2 ? "cohere2." : "command-r.") {}
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = false;
        check_experts(f, hp, /*allowed=*/false, /*required=*/false);
        hp.rms_eps = (float)f.get_float(a_ + "attention.layer_norm_epsilon", 1e-5);
        hp.logit_mult = (float)f.get_float(a_ + "logit_scale", 1.0);
        if (!(hp.logit_mult > 0.0f)) fail(f.path(), ": ", a_, "logit_scale must be positive, got ", hp.logit_mult);
        if (!f.find_tensor("blk.0.attn_q_norm.weight") != !f.find_tensor("blk.0.attn_k_norm.weight"))
            fail(f.path(), ": per-head q/k LayerNorms need both blk.N.attn_q_norm and blk.N.attn_k_norm");
        hp.swa_layer.assign(hp.n_layer, false);
        if (!cohere2_) return;
        hp.n_swa = (int32_t)f.get_uint(a_ + "attention.sliding_window");
        if (hp.n_swa <= 0) fail(f.path(), ": ", a_, "attention.sliding_window must be positive, got ", hp.n_swa);
        hp.rope_base_swa = (float)f.get_float(a_ + "rope.freq_base_swa", hp.rope_base);
        // A period p (layer l slides when l % p < p - 1; llama.cpp's default 4) or one bool per layer.
        const GGUFValue* pat = f.find(a_ + "attention.sliding_window_pattern");
        if (pat && pat->type == GGUFType::ARRAY) {
            if ((int64_t)pat->arr.size() != hp.n_layer || pat->elem_type != GGUFType::BOOL)
                fail(f.path(), ": ", a_, "attention.sliding_window_pattern must be a period or ", hp.n_layer,
                     " bools, got an array of ", pat->arr.size());
            for (int32_t l = 0; l < hp.n_layer; ++l) hp.swa_layer[l] = pat->arr[l].num.b;
            return;
        }
        const int64_t period = (int64_t)f.get_uint(a_ + "attention.sliding_window_pattern", 4);
        if (period <= 0) fail(f.path(), ": ", a_, "attention.sliding_window_pattern must be positive, got ", period);
        for (int32_t l = 0; l < hp.n_layer; ++l) hp.swa_layer[l] = l % period < period - 1;
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        const int64_t E = hp.n_embd, F = hp.n_ff;
        const int64_t D = hp.head_dim, QW = (int64_t)hp.n_head * D, KW = (int64_t)hp.n_head_kv * D;
        return {
            {Role::attn_norm, "attn_norm.weight", {E}},
            {Role::wq, "attn_q.weight", {E, QW}},
            {Role::wk, "attn_k.weight", {E, KW}},
            {Role::wv, "attn_v.weight", {E, KW}},
            {Role::wo, "attn_output.weight", {QW, E}},
            {Role::gate, "ffn_gate.weight", {E, F}},
            {Role::up, "ffn_up.weight", {E, F}},
            {Role::down, "ffn_down.weight", {F, E}},
            {Role::q_norm, "attn_q_norm.weight", {D, hp.n_head}, /*optional=*/true, /*vector=*/true},
            {Role::k_norm, "attn_k_norm.weight", {D, hp.n_head_kv}, /*optional=*/true, /*vector=*/true},
        };
    }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        if (hp.swa_layer[l]) {
            c.shape.window = hp.n_swa;
            c.rope.base = hp.rope_base_swa;
        }
        return c;
    }
    bool layernorm_head() const override { return true; }
    LogitMap logit_map(const HParams& hp) const override { return {hp.logit_mult, 0.0f}; }
    // x += residual; xn = LayerNorm(x); out = attention(xn) + ffn(xn). cohere2's global layers (no
    // window) do not rotate q and k.
    const float* forward_block(const BlockRun& r) const override {
        const int32_t n = r.n_tok, E = r.hp.n_embd;
        const BlockBuffers& b = r.buf;
        if (r.residual) r.be.add(r.x, r.residual, (int64_t)n * E);
        r.be.layernorm(r.x, r.w.v(Role::attn_norm), nullptr, n, E, r.hp.rms_eps, b.xn);
        const Weight* qkv[3] = {r.w.m(Role::wq), r.w.m(Role::wk), r.w.m(Role::wv)};
        float* qkv_out[3] = {b.q, b.k, b.v};
        r.be.matmul_many(qkv, qkv_out, 3, b.xn, n);
        if (const float* qn = r.w.v(Role::q_norm)) {
            head_layernorm(r.be, b.q, qn, n, r.hp.n_head, r.hp.head_dim, r.hp.rms_eps);
            head_layernorm(r.be, b.k, r.w.v(Role::k_norm), n, r.hp.n_head_kv, r.hp.head_dim, r.hp.rms_eps);
        }
        if (!cohere2_ || r.cfg.shape.window > 0) {
            r.be.rope(b.q, n, r.hp.n_head, r.cfg.rope);
            r.be.rope(b.k, n, r.hp.n_head_kv, r.cfg.rope);
        }
        r.be.kv_store(r.kv, b.k, b.v, n);
        r.be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), n, b, r.out_a);
        const Weight* gate_up[2] = {r.w.m(Role::gate), r.w.m(Role::up)};
        float* gate_up_out[2] = {b.gate, b.up};
        r.be.matmul_many(gate_up, gate_up_out, 2, b.xn, n);
        r.be.gated_act(Activation::SiLU, b.gate, b.up, (int64_t)n * r.hp.n_ff, b.gate);
        r.be.matmul(*r.w.m(Role::down), b.gate, n, r.out_b);
        r.be.add(r.out_b, r.out_a, (int64_t)n * E);
        return r.out_b;
    }

private:
    // x [n_tok][n_heads][head_dim]: each head LayerNormed (no bias) by its own weight, gamma
    // [n_heads][head_dim]. One layernorm per token and head: the contract's layernorm takes one
    // weight for all its rows.
    static void head_layernorm(Backend& be, float* x, const float* gamma, int32_t n_tok, int32_t n_heads,
                               int32_t head_dim, float eps) {
        for (int32_t t = 0; t < n_tok; ++t)
            for (int32_t h = 0; h < n_heads; ++h) {
                float* row = x + ((int64_t)t * n_heads + h) * head_dim;
                be.layernorm(row, gamma + (int64_t)h * head_dim, nullptr, 1, head_dim, eps, row);
            }
    }
    bool cohere2_;
    std::string a_;
};

const Architecture& command_r_architecture() {
    static const CohereArch arch(/*cohere2=*/false);
    return arch;
}

const Architecture& cohere2_architecture() {
    static const CohereArch arch(/*cohere2=*/true);
    return arch;
}

}  // namespace ember
