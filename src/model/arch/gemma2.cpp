// Gemma 2: embeddings scaled by sqrt(n_embd); RMSNorms before and after attention and the
// feed-forward; GeLU(tanh)-gated feed-forward; neox rope; every other layer (from the first) a
// sliding window; attention scores and the logits soft-capped; tied head. GGUF conventions are
// llama.cpp's (norm weights stored as 1 + w; caps of 50 and 30 where the file gives none).
#include <cmath>

#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

class Gemma2Arch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = true;
        check_experts(f, hp, /*allowed=*/false, /*required=*/false);
        hp.attn_scale = (float)f.get_float("gemma2.attention.scale", 0.0);
        hp.attn_softcap = (float)f.get_float("gemma2.attn_logit_softcapping", 50.0);
        hp.final_softcap = (float)f.get_float("gemma2.final_logit_softcapping", 30.0);
        for (const auto& [key, cap] : {std::pair{"attn_logit_softcapping", hp.attn_softcap},
                                       std::pair{"final_logit_softcapping", hp.final_softcap}})
            if (!(cap > 0.0f) || std::isinf(cap)) fail(f.path(), ": gemma2.", key, " must be positive, got ", cap);
        hp.n_swa = (int32_t)f.get_uint("gemma2.attention.sliding_window", 4096);
        hp.rope_base_swa = (float)f.get_float("gemma2.rope.freq_base_swa", hp.rope_base);
        read_swa_pattern(f, "gemma2", 2, hp);
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        std::vector<TensorSpec> t = llama_block_tensors(hp, /*biases=*/false, /*qk_norm=*/false);
        t.push_back({Role::post_attn_norm, "post_attention_norm.weight", {hp.n_embd}});
        t.push_back({Role::post_ffn_norm, "post_ffw_norm.weight", {hp.n_embd}});
        return t;
    }
    float embd_scale(const HParams& hp) const override { return std::sqrt((float)hp.n_embd); }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        // attention.scale where the file gives one; else llama.cpp's rule: the 27B model (46
        // layers) scales queries by n_embd / n_head, the others by the head dimension.
        if (hp.attn_scale > 0.0f) c.shape.scale = hp.attn_scale;
        else if (hp.n_layer == 46) c.shape.scale = 1.0f / std::sqrt((float)(hp.n_embd / hp.n_head));
        c.shape.softcap = hp.attn_softcap;
        if (hp.swa_layer[l] && hp.n_swa > 0) {
            c.shape.window = hp.n_swa;
            c.rope.base = hp.rope_base_swa;
        }
        return c;
    }
    const float* forward_block(const BlockRun& r) const override {
        return sandwich_norm_block(r, Activation::GeLUTanh);
    }
    LogitMap logit_map(const HParams& hp) const override { return {1.0f, hp.final_softcap}; }
};

const Architecture& gemma2_architecture() {
    static const Gemma2Arch arch;
    return arch;
}

}  // namespace ember
