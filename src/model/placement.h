// One plan for where everything runs, tensor by tensor: the device of each block (attention, norms,
// dense feed-forward), of each block's mixture-of-experts tensors, and of the output head, decided
// once at load from n_gpu_layers, the tensor overrides (-ot, --cpu-moe, --n-cpu-moe) and the GPU
// budget. The context follows it; the streamed weights (CPU blocks run on the GPU for large
// batches) are their own unit (streamed_weights.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ember/gguf.h"
#include "ember/model.h"

namespace ember {

enum class Device { cpu, gpu };

const char* device_name(Device d);   // "CPU", "CUDA"

// A tensor of a mixture's feed-forward that runs with its experts (router, experts, shared expert,
// their biases), by its GGUF name ("blk.N.ffn_gate_exps.weight").
bool is_moe_tensor(const std::string& name);
// A routed expert tensor (ffn_*_exps): the ones --cpu-moe and --n-cpu-moe place.
bool is_expert_tensor(const std::string& name);

struct PlacedTensor {
    std::string name;
    size_t bytes = 0;
    Device device = Device::cpu;
};

struct PlacementPlan {
    std::vector<Device> block;     // [n_layer] attention, norms and dense tensors
    std::vector<Device> experts;   // [n_layer] the block's MoE tensors (its own device for a dense block)
    Device head = Device::cpu;
    int32_t n_gpu_blocks = 0;
    std::string warning;   // why the plan differs from what the parameters asked for; empty when it does not
    std::vector<PlacedTensor> tensors;   // every tensor of the file, in file order
    // One line: tensors and MiB on each device, and which blocks' experts sit apart from their block.
    std::string summary;
    std::optional<size_t> gpu_budget;   // bytes the experts were fitted to; unset: no budget applied
    bool any_gpu() const { return n_gpu_blocks > 0; }
    bool any_cpu() const { return n_gpu_blocks < (int32_t)block.size(); }
    // Block l's experts run on another device than its attention.
    bool experts_apart(int32_t l) const { return experts[l] != block[l]; }
    bool any_experts_apart() const;
};

// GPU memory the budget leaves free for the KV cache, scratch and the library's workspaces when
// the budget is the free memory (llama.cpp's -fit keeps the same margin).
constexpr size_t kGpuBudgetMarginMiB = 1024;

// The plan for the n_layer blocks of file f under p. The last n_gpu_layers blocks go on the GPU
// (-1: all); the head follows them whenever any block is there. Then the overrides, the first
// matching pattern deciding each tensor (p.override_tensor in order, then --n-cpu-moe's and
// --cpu-moe's): a block's non-MoE tensors must agree (they move the whole block), its routed
// experts decide where its MoE tensors go. Last the budget (p.moe_gpu_budget_mb > 0, or free
// memory less kGpuBudgetMarginMiB when the GPU tensors would not fit in gpu_free_bytes; 0: not
// known): the experts of the first blocks move to the CPU until the GPU tensors fit. Without a
// GPU backend (have_gpu false) everything runs on the CPU and `warning` says so. Throws
// InvalidInput naming the option for a malformed override, a bad regex, an unknown device,
// n_cpu_moe past n_layer, or an override that splits a block.
PlacementPlan plan_placement(const GGUFFile& f, int32_t n_layer, const ModelParams& p, bool have_gpu,
                             size_t gpu_free_bytes);

}  // namespace ember
