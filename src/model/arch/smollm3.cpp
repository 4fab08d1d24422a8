// SmolLM3: the llama block (llama rope layout) with no rope in every fourth layer (NoPE: layers
// 3, 7, 11, ...). llama.cpp fixes that interval for the architecture and its files carry no key
// for it, so neither does ember.
#include "model/arch/arch_common.h"

namespace ember {

class SmolLM3Arch final : public PreNormArch {
public:
    SmolLM3Arch() : PreNormArch(/*neox=*/false, /*biases=*/false, /*qk_norm=*/false) {}
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = PreNormArch::layer_config(hp, l, rope);
        c.use_rope = (l + 1) % kNoRopeInterval != 0;
        return c;
    }

private:
    static constexpr int32_t kNoRopeInterval = 4;
};

const Architecture& smollm3_architecture() {
    static const SmolLM3Arch arch;
    return arch;
}

}  // namespace ember
