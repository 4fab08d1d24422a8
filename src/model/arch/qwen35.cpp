// Qwen3.5 (dense): the Qwen hybrid layers (qwen_hybrid.h) with a SwiGLU feed-forward in every block.
#include "model/arch/qwen_hybrid.h"

namespace ember {

const Architecture& qwen35_architecture() {
    static const QwenHybridArch arch(QwenHybridKind{});
    return arch;
}

}  // namespace ember
