// OLMo 2 (and OLMo 3): no norm before attention or the feed-forward, RMSNorms after each instead;
// q and k RMSNormed over their full width (all heads at once, before rope); SwiGLU feed-forward;
// neox rope. OLMo 3's files set a sliding window for three layers of every four (or a per-layer
// pattern); those rotate without the rope scaling, as llama.cpp's olmo2 does.
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

class Olmo2Arch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = true;
        check_experts(f, hp, /*allowed=*/false, /*required=*/false);
        hp.n_swa = (int32_t)f.get_uint("olmo2.attention.sliding_window", 0);
        hp.rope_base_swa = (float)f.get_float("olmo2.rope.freq_base_swa", hp.rope_base);
        if (hp.n_swa > 0) read_swa_pattern(f, "olmo2", 4, hp);
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        const int64_t E = hp.n_embd, F = hp.n_ff;
        const int64_t QW = (int64_t)hp.n_head * hp.head_dim, KW = (int64_t)hp.n_head_kv * hp.head_dim;
        return {
            {Role::wq, "attn_q.weight", {E, QW}},
            {Role::wk, "attn_k.weight", {E, KW}},
            {Role::wv, "attn_v.weight", {E, KW}},
            {Role::wo, "attn_output.weight", {QW, E}},
            {Role::q_norm, "attn_q_norm.weight", {QW}},
            {Role::k_norm, "attn_k_norm.weight", {KW}},
            {Role::post_attn_norm, "post_attention_norm.weight", {E}},
            {Role::gate, "ffn_gate.weight", {E, F}},
            {Role::up, "ffn_up.weight", {E, F}},
            {Role::down, "ffn_down.weight", {F, E}},
            {Role::post_ffn_norm, "post_ffw_norm.weight", {E}},
        };
    }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        if (hp.swa_layer[l]) {
            c.shape.window = hp.n_swa;
            c.rope = RopeParams{};
            c.rope.base = hp.rope_base_swa;
            c.rope.head_dim = rope.head_dim;
            c.rope.neox = rope.neox;
        }
        return c;
    }
    // The fused ops norm their input; these blocks read the residual stream itself, so they run
    // on the primitives.
    const float* forward_block(const BlockRun& r) const override {
        Backend& be = r.be;
        const BlockBuffers& b = r.buf;
        const int32_t n = r.n_tok, E = r.hp.n_embd, D = r.hp.head_dim;
        const int32_t QW = r.hp.n_head * D, KW = r.hp.n_head_kv * D;
        const int64_t F = r.hp.n_ff;
        const float eps = r.hp.rms_eps;
        if (r.residual) be.add(r.x, r.residual, (int64_t)n * E);
        const Weight* qkv[3] = {r.w.m(Role::wq), r.w.m(Role::wk), r.w.m(Role::wv)};
        float* qkv_out[3] = {b.q, b.k, b.v};
        be.matmul_many(qkv, qkv_out, 3, r.x, n);
        be.rmsnorm(b.q, r.w.v(Role::q_norm), n, QW, eps, b.q);
        be.rmsnorm(b.k, r.w.v(Role::k_norm), n, KW, eps, b.k);
        be.rope(b.q, n, r.hp.n_head, r.cfg.rope);
        be.rope(b.k, n, r.hp.n_head_kv, r.cfg.rope);
        be.kv_store(r.kv, b.k, b.v, n);
        be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), n, b, r.out_a);
        be.rmsnorm(r.out_a, r.w.v(Role::post_attn_norm), n, E, eps, r.out_b);
        be.add(r.x, r.out_b, (int64_t)n * E);
        const Weight* gate_up[2] = {r.w.m(Role::gate), r.w.m(Role::up)};
        float* gate_up_out[2] = {b.gate, b.up};
        be.matmul_many(gate_up, gate_up_out, 2, r.x, n);
        be.gated_act(Activation::SiLU, b.gate, b.up, n * F, b.gate);
        be.matmul(*r.w.m(Role::down), b.gate, n, r.out_a);
        be.rmsnorm(r.out_a, r.w.v(Role::post_ffn_norm), n, E, eps, r.out_b);
        return r.out_b;
    }
};

const Architecture& olmo2_architecture() {
    static const Olmo2Arch arch;
    return arch;
}

}  // namespace ember
