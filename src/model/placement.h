// One plan for where everything runs: the device of each block and of the output head, decided
// from n_gpu_layers once at load. The context follows it; the streamed offload (CPU blocks run on
// the GPU for large batches) is its own unit (streamed_offload.h).
#pragma once
#include <cstdint>
#include <vector>

#include "ember/model.h"

namespace ember {

enum class Device { cpu, gpu };

struct PlacementPlan {
    std::vector<Device> block;   // [n_layer]
    Device head = Device::cpu;
    int32_t n_gpu_blocks = 0;
    bool any_gpu() const { return n_gpu_blocks > 0; }
    bool any_cpu() const { return n_gpu_blocks < (int32_t)block.size(); }
};

// The last n_gpu_layers blocks go on the GPU (-1: all); the head follows them onto the GPU
// whenever any block is there (llama.cpp leaves it on the CPU unless every block is offloaded,
// a trap its users keep falling into).
PlacementPlan plan_placement(int32_t n_layer, int32_t n_gpu_layers);

}  // namespace ember
