// Qwen3.5/3.6 MoE: the Qwen hybrid layers (qwen_hybrid.h) with routed experts and a gated shared
// expert in every block.
#include "model/arch/qwen_hybrid.h"

namespace ember {

const Architecture& qwen35moe_architecture() {
    static const QwenHybridArch arch(QwenHybridKind{/*experts=*/true, /*grouped_v=*/false});
    return arch;
}

}  // namespace ember
