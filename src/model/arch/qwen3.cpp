// Qwen3: the llama block with a per-head RMSNorm of q and k before rope, no biases, neox rope,
// and a head dimension of its own (attention.key_length, not n_embd / n_head).
#include "model/arch/arch_common.h"

namespace ember {

const Architecture& qwen3_architecture() {
    static const PreNormArch arch(/*neox=*/true, /*biases=*/false, /*qk_norm=*/true);
    return arch;
}

}  // namespace ember
