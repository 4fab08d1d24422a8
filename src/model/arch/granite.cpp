// Granite (3.x dense): the llama block with IBM's muP multipliers: embeddings times
// embedding_scale, each attention and feed-forward output times residual_scale before it joins
// the residual stream, queries scaled by attention.scale, logits divided by logit_scale.
#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

class GraniteArch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = false;
        check_experts(f, hp, /*allowed=*/false, /*required=*/false);
        hp.attn_scale = (float)f.get_float("granite.attention.scale", 0.0);
        hp.embedding_scale = (float)f.get_float("granite.embedding_scale", 0.0);
        // llama.cpp: residual_scale 0 (absent) leaves the outputs unscaled; logit_scale is required.
        const float rs = (float)f.get_float("granite.residual_scale", 0.0);
        hp.residual_scale = rs != 0.0f ? rs : 1.0f;
        hp.logit_scale = (float)f.get_float("granite.logit_scale");
        if (hp.logit_scale == 0.0f)
            fail(f.path(), ": granite.logit_scale must not be 0 (the logits are divided by it)");
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        return llama_block_tensors(hp, /*biases=*/false, /*qk_norm=*/false);
    }
    float embd_scale(const HParams& hp) const override {
        return hp.embedding_scale != 0.0f ? hp.embedding_scale : 1.0f;
    }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        if (hp.attn_scale != 0.0f) c.shape.scale = hp.attn_scale;
        return c;
    }
    const float* forward_block(const BlockRun& r) const override {
        const int32_t n = r.n_tok;
        const int64_t width = (int64_t)n * r.hp.n_embd;
        const float rs = r.hp.residual_scale;
        r.be.attn_in(attn_in_weights(r), r.x, r.residual, n, r.kv, r.buf);
        r.be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), n, r.buf, r.out_a);
        if (rs != 1.0f) r.be.scale_softcap(r.out_a, width, rs, 0.0f);
        r.be.ffn(ffn_weights(r, Activation::SiLU), r.x, r.out_a, n, r.buf, r.out_b);
        if (rs != 1.0f) r.be.scale_softcap(r.out_b, width, rs, 0.0f);
        return r.out_b;
    }
    LogitMap logit_map(const HParams& hp) const override { return {1.0f / hp.logit_scale, 0.0f}; }
};

const Architecture& granite_architecture() {
    static const GraniteArch arch;
    return arch;
}

}  // namespace ember
