// Llama and Mistral: pre-norm blocks, SwiGLU feed-forward, rope on adjacent pairs, no biases.
#include "model/arch/arch_common.h"

namespace ember {

class LlamaArch final : public Architecture {
public:
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        return llama_block_tensors(hp, /*biases=*/false, /*qk_norm=*/false);
    }
    const float* forward_block(const BlockRun& r) const override { return pre_norm_block(r, Activation::SiLU); }
};

const Architecture& llama_architecture() {
    static const LlamaArch arch;
    return arch;
}

}  // namespace ember
