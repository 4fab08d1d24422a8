// One plan for where everything runs: the device of each block and of the output head, decided
// from n_gpu_layers once at load. The context follows it; the streamed weights (CPU blocks run on
// the GPU for large batches) are their own unit (streamed_weights.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ember/model.h"

namespace ember {

enum class Device { cpu, gpu };

struct PlacementPlan {
    std::vector<Device> block;   // [n_layer]
    Device head = Device::cpu;
    int32_t n_gpu_blocks = 0;
    std::string warning;          // why the plan differs from what n_gpu_layers asked for; empty when it does not
    bool any_gpu() const { return n_gpu_blocks > 0; }
    bool any_cpu() const { return n_gpu_blocks < (int32_t)block.size(); }
};

// The last n_gpu_layers blocks go on the GPU (-1: all); the head follows them onto the GPU
// whenever any block is there (llama.cpp leaves it on the CPU unless every block is offloaded,
// a trap its users keep falling into). Without a GPU backend built in (have_gpu false) everything
// runs on the CPU and `warning` says so: as llama-cpp-python does, since countless scripts pass
// n_gpu_layers=-1 whatever they run on.
PlacementPlan plan_placement(int32_t n_layer, int32_t n_gpu_layers, bool have_gpu);

}  // namespace ember
