// Qwen3: the llama block with a per-head RMSNorm of q and k before rope, no biases, neox rope,
// and a head dimension of its own (attention.key_length, not n_embd / n_head).
#include "model/arch/arch_common.h"

namespace ember {

class Qwen3Arch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override { (void)f, hp.rope_neox = true; }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        return llama_block_tensors(hp, /*biases=*/false, /*qk_norm=*/true);
    }
    const float* forward_block(const BlockRun& r) const override { return pre_norm_block(r, Activation::SiLU); }
};

const Architecture& qwen3_architecture() {
    static const Qwen3Arch arch;
    return arch;
}

}  // namespace ember
