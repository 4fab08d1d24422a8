// Granite 4.0 hybrid (granitehybrid): Mamba2 layers (state per sequence) and attention layers without
// rope, each followed by a SwiGLU feed-forward, or in the mixture models by SwiGLU experts (softmax
// top k, renormalized) beside a shared expert; with Granite's muP multipliers (embeddings times
// embedding_scale, both outputs of a block times residual_scale, queries scaled by attention.scale,
// logits divided by logit_scale). A layer with head_count_kv 0 is a Mamba2 layer.
#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/mamba2_common.h"
#include "model/arch/moe_common.h"

namespace ember {

namespace {

class GraniteHybridArch : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        const std::string a = hp.arch + ".";
        check_experts(f, hp, true, false);
        // A mixture's experts are feed_forward_length wide (n_ff_exp); its shared expert, the dense
        // models' feed-forward, takes hp.n_ff.
        if (hp.n_expert > 0) {
            hp.n_ff = (int32_t)f.get_uint(a + "expert_shared_feed_forward_length");
            if (hp.n_ff <= 0)
                fail(f.path(), ": ", a, "expert_shared_feed_forward_length must be positive, got ", hp.n_ff);
        }
        // llama.cpp rotates q and k unless rope.scaling.finetuned says false, which its converter
        // writes for every hybrid Granite (their attention has no positions).
        if (f.get_bool(a + "rope.scaling.finetuned", true))
            fail(f.path(), ": ", a, "rope.scaling.finetuned must be false: ", hp.arch,
                 " with rope in its attention layers is not supported");
        hp.attn_scale = (float)f.get_float(a + "attention.scale", 0.0);
        hp.embedding_scale = (float)f.get_float(a + "embedding_scale", 0.0);
        // As llama.cpp: each multiplier that is absent (or 0) is not applied.
        const float rs = (float)f.get_float(a + "residual_scale", 0.0);
        hp.residual_scale = rs != 0.0f ? rs : 1.0f;
        const float ls = (float)f.get_float(a + "logit_scale", 0.0);
        hp.logit_scale = ls != 0.0f ? ls : 1.0f;
        read_mamba2_hparams(f, hp);
        hp.recurrent_layer.assign(hp.n_layer, false);
        for (int32_t l = 0; l < hp.n_layer; ++l) hp.recurrent_layer[l] = hp.layer_n_head_kv(l) == 0;
    }

    std::vector<TensorSpec> block_tensors(const HParams& hp) const override { return layer_specs(hp, false); }
    std::vector<TensorSpec> layer_tensors(const HParams& hp, int32_t l) const override {
        return layer_specs(hp, hp.recurrent_layer[l]);
    }
    float embd_scale(const HParams& hp) const override {
        return hp.embedding_scale != 0.0f ? hp.embedding_scale : 1.0f;
    }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        c.use_rope = false;
        if (hp.attn_scale != 0.0f) c.shape.scale = hp.attn_scale;
        return c;
    }
    LogitMap logit_map(const HParams& hp) const override { return {1.0f / hp.logit_scale, 0.0f}; }
    int64_t recurrent_scratch_floats(const HParams& hp) const override { return mamba2_scratch_floats(hp); }

    const float* forward_block(const BlockRun& r) const override {
        const int32_t n = r.n_tok;
        const int64_t width = (int64_t)n * r.hp.n_embd;
        const float rs = r.hp.residual_scale;
        if (r.state) {
            r.be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), n, r.hp.n_embd, r.hp.rms_eps, r.buf.xn);
            mamba2_mixer(r, r.out_a);
        } else {
            r.be.attn_in(attn_in_weights(r), r.x, r.residual, n, r.kv, r.buf);
            r.be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), n, r.buf, r.out_a);
        }
        if (rs != 1.0f) r.be.scale_softcap(r.out_a, width, rs, 0.0f);
        if (r.hp.n_expert > 0) run_moe_ffn(r, MoeConfig{}, r.out_a, r.out_b);
        else r.be.ffn(ffn_weights(r, Activation::SiLU), r.x, r.out_a, n, r.buf, r.out_b);
        if (rs != 1.0f) r.be.scale_softcap(r.out_b, width, rs, 0.0f);
        return r.out_b;
    }

private:
    static std::vector<TensorSpec> layer_specs(const HParams& hp, bool recurrent) {
        const int64_t E = hp.n_embd, F = hp.n_ff, D = hp.head_dim;
        const int64_t QW = (int64_t)hp.n_head * D, KW = (int64_t)hp.n_head_kv * D;
        std::vector<TensorSpec> t = {{Role::attn_norm, "attn_norm.weight", {E}},
                                     {Role::ffn_norm, "ffn_norm.weight", {E}}};
        if (hp.n_expert > 0) {
            for (const TensorSpec& s : moe_block_tensors(hp, false)) t.push_back(s);
            t.push_back({Role::gate_shexp, "ffn_gate_shexp.weight", {E, F}});
            t.push_back({Role::up_shexp, "ffn_up_shexp.weight", {E, F}});
            t.push_back({Role::down_shexp, "ffn_down_shexp.weight", {F, E}});
        } else {
            t.push_back({Role::gate, "ffn_gate.weight", {E, F}});
            t.push_back({Role::up, "ffn_up.weight", {E, F}});
            t.push_back({Role::down, "ffn_down.weight", {F, E}});
        }
        const std::vector<TensorSpec> mixer = recurrent ? mamba2_tensors(hp)
                                                        : std::vector<TensorSpec>{
                                                              {Role::wq, "attn_q.weight", {E, QW}},
                                                              {Role::wk, "attn_k.weight", {E, KW}},
                                                              {Role::wv, "attn_v.weight", {E, KW}},
                                                              {Role::wo, "attn_output.weight", {QW, E}},
                                                          };
        t.insert(t.end(), mixer.begin(), mixer.end());
        return t;
    }
};

}  // namespace

const Architecture& granite_hybrid_architecture() {
    static const GraniteHybridArch arch;
    return arch;
}

}  // namespace ember
