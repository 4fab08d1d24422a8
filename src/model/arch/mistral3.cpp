// Mistral 3 (Ministral 3, Devstral Small 2): the llama block (rope on adjacent pairs, no biases)
// with YaRN and llama 4's attention temperature: queries at position p scaled by
// 1 + attention.temperature_scale * ln(1 + floor(p / rope.scaling.original_context_length)).
#include "ember/status.h"
#include "model/arch/arch_common.h"

namespace ember {

class Mistral3Arch final : public PreNormArch {
public:
    Mistral3Arch() : PreNormArch(/*neox=*/false, /*biases=*/false, /*qk_norm=*/false) {}
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        PreNormArch::read_hparams(f, hp);
        hp.attn_scale = (float)f.get_float("mistral3.attention.scale", 0.0);
        hp.attn_temp_scale = (float)f.get_float("mistral3.attention.temperature_scale", 0.0);
        if (hp.attn_temp_scale != 0.0f && hp.rope_n_ctx_orig <= 0)
            fail(f.path(), ": mistral3.attention.temperature_scale needs a positive ",
                 "mistral3.rope.scaling.original_context_length, got ", hp.rope_n_ctx_orig);
    }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        if (hp.attn_scale > 0.0f) c.shape.scale = hp.attn_scale;
        return c;
    }
};

const Architecture& mistral3_architecture() {
    static const Mistral3Arch arch;
    return arch;
}

}  // namespace ember
