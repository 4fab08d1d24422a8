// plan_placement: blocks and head to devices.
#include "model/placement.h"

#include <algorithm>

namespace ember {

PlacementPlan plan_placement(int32_t n_layer, int32_t n_gpu_layers) {
    PlacementPlan p;
    p.n_gpu_blocks = n_gpu_layers < 0 ? n_layer : std::min(n_gpu_layers, n_layer);
    p.block.assign(n_layer, Device::cpu);
    for (int32_t l = n_layer - p.n_gpu_blocks; l < n_layer; ++l) p.block[l] = Device::gpu;
    p.head = p.any_gpu() ? Device::gpu : Device::cpu;
    return p;
}

}  // namespace ember
