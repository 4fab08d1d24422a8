// Llama and Mistral: pre-norm blocks, SwiGLU feed-forward, rope on adjacent pairs, no biases.
#include "model/arch/arch_common.h"

namespace ember {

const Architecture& llama_architecture() {
    static const PreNormArch arch(/*neox=*/false, /*biases=*/false, /*qk_norm=*/false);
    return arch;
}

}  // namespace ember
