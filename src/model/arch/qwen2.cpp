// Qwen2: the llama block with Q, K, V biases and rope on (i, i + d/2) pairs (neox).
#include "model/arch/arch_common.h"

namespace ember {

const Architecture& qwen2_architecture() {
    static const PreNormArch arch(/*neox=*/true, /*biases=*/true, /*qk_norm=*/false);
    return arch;
}

}  // namespace ember
