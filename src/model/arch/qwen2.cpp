// Qwen2: the llama block with Q, K, V biases and rope on (i, i + d/2) pairs (neox).
#include "model/arch/arch_common.h"

namespace ember {

class Qwen2Arch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override { (void)f, hp.rope_neox = true; }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        return llama_block_tensors(hp, /*biases=*/true, /*qk_norm=*/false);
    }
    const float* forward_block(const BlockRun& r) const override { return pre_norm_block(r, Activation::SiLU); }
};

const Architecture& qwen2_architecture() {
    static const Qwen2Arch arch;
    return arch;
}

}  // namespace ember
