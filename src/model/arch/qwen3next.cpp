// Qwen3-Next: the Qwen hybrid layers (qwen_hybrid.h) with routed experts and a gated shared expert,
// its DeltaNet v heads grouped by k head and beta and alpha in one projection, as its files keep them.
#include "model/arch/qwen_hybrid.h"

namespace ember {

const Architecture& qwen3next_architecture() {
    static const QwenHybridArch arch(QwenHybridKind{/*experts=*/true, /*grouped_v=*/true});
    return arch;
}

}  // namespace ember
