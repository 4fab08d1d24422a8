// Llama and Mistral: pre-norm blocks, SwiGLU feed-forward, rope on adjacent pairs, no biases.
// Mixtral is the same file with a mixture of SwiGLU experts in place of the feed-forward
// (llama.expert_count; softmax routing, the chosen weights renormalized).
#include "model/arch/arch_common.h"

namespace ember {

const Architecture& llama_architecture() {
    static const PreNormArch arch(/*neox=*/false, /*biases=*/false, /*qk_norm=*/false, Experts::optional);
    return arch;
}

}  // namespace ember
