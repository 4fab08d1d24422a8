// Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm, neox rope, its own head dimension) with a
// mixture of SwiGLU experts in every block: softmax routing, the chosen weights renormalized
// unless the file says qwen3moe.expert_weights_norm = false (HF's norm_topk_prob).
#include "model/arch/arch_common.h"

namespace ember {

const Architecture& qwen3moe_architecture() {
    static const PreNormArch arch(/*neox=*/true, /*biases=*/false, /*qk_norm=*/true, Experts::required);
    return arch;
}

}  // namespace ember
