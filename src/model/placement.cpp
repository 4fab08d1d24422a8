// plan_placement: blocks and head to devices.
#include "model/placement.h"

#include <algorithm>

namespace ember {

PlacementPlan plan_placement(int32_t n_layer, int32_t n_gpu_layers, bool have_gpu) {
    PlacementPlan p;
    p.n_gpu_blocks = n_gpu_layers < 0 ? n_layer : std::min(n_gpu_layers, n_layer);
    if (!have_gpu && n_gpu_layers != 0) {
        p.warning = "n_gpu_layers=" + std::to_string(n_gpu_layers) +
                    " ignored: this ember was built without CUDA, so all blocks run on the CPU "
                    "(rebuild with -Ccmake.define.EMBER_CUDA=ON to offload)";
        p.n_gpu_blocks = 0;
    }
    p.block.assign(n_layer, Device::cpu);
    for (int32_t l = n_layer - p.n_gpu_blocks; l < n_layer; ++l) p.block[l] = Device::gpu;
    p.head = p.any_gpu() ? Device::gpu : Device::cpu;
    return p;
}

}  // namespace ember
