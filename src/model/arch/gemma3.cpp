// Gemma 3: embeddings scaled by sqrt(n_embd); q/k RMSNorm; RMSNorms after attention and after
// the feed-forward as well as before; GeLU(tanh)-gated feed-forward; neox rope; local layers
// with a sliding window and a rope base of their own, every `pattern`-th layer global; tied head.
// GGUF conventions are llama.cpp's (norm weights stored as 1 + w).
#include <cmath>

#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

class Gemma3Arch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = true;
        check_experts(f, hp, /*allowed=*/false, /*required=*/false);
        hp.attn_scale = (float)f.get_float("gemma3.attention.scale", 0.0);
        hp.n_swa = (int32_t)f.get_uint("gemma3.attention.sliding_window", 0);
        hp.rope_base_swa = (float)f.get_float("gemma3.rope.freq_base_swa", 10000.0);
        if (f.find("gemma3.final_logit_softcapping"))
            fail(f.path(), ": gemma3.final_logit_softcapping is not supported (Gemma 3 releases have none)");
        hp.swa_layer.assign(hp.n_layer, false);
        if (hp.n_swa <= 0) return;
        // Which layers are local: a period p (layer l is local when l % p < p - 1; llama.cpp's
        // gemma3 has five local layers, then one global), or one bool per layer.
        const GGUFValue* pat = f.find("gemma3.attention.sliding_window_pattern");
        if (pat && pat->type == GGUFType::ARRAY) {
            if ((int64_t)pat->arr.size() != hp.n_layer || pat->elem_type != GGUFType::BOOL)
                fail(f.path(), ": gemma3.attention.sliding_window_pattern must be a period or ", hp.n_layer,
                     " bools, got an array of ", pat->arr.size());
            for (int32_t l = 0; l < hp.n_layer; ++l) hp.swa_layer[l] = pat->arr[l].num.b;
            return;
        }
        const int64_t period = (int64_t)f.get_uint("gemma3.attention.sliding_window_pattern", 6);
        if (period <= 0) fail(f.path(), ": gemma3.attention.sliding_window_pattern must be positive, got ", period);
        for (int32_t l = 0; l < hp.n_layer; ++l) hp.swa_layer[l] = l % period < period - 1;
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        std::vector<TensorSpec> t = llama_block_tensors(hp, /*biases=*/false, /*qk_norm=*/true);
        t.push_back({Role::post_attn_norm, "post_attention_norm.weight", {hp.n_embd}});
        t.push_back({Role::post_ffn_norm, "post_ffw_norm.weight", {hp.n_embd}});
        return t;
    }
    float embd_scale(const HParams& hp) const override { return std::sqrt((float)hp.n_embd); }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        // attention.scale where the file gives one (query_pre_attn_scalar^-0.5 differing from the
        // head dimension's); else llama.cpp's rule: the 27B model (62 layers) scales queries by
        // n_embd / n_head, the others by the head dimension.
        if (hp.attn_scale > 0.0f) c.shape.scale = hp.attn_scale;
        else if (hp.n_layer == 62) c.shape.scale = 1.0f / std::sqrt((float)(hp.n_embd / hp.n_head));
        if (hp.swa_layer[l]) {
            c.shape.window = hp.n_swa;
            // Local layers rotate at their own base and without the global layers' scaling.
            c.rope = RopeParams{};
            c.rope.base = hp.rope_base_swa;
            c.rope.head_dim = rope.head_dim;
            c.rope.neox = rope.neox;
        }
        return c;
    }
    const float* forward_block(const BlockRun& r) const override {
        return sandwich_norm_block(r, Activation::GeLUTanh);
    }
};

const Architecture& gemma3_architecture() {
    static const Gemma3Arch arch;
    return arch;
}

}  // namespace ember
