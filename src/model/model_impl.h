// Internals of a loaded model: hyperparameters, its architecture, the GGUF tensors of each block,
// the placement plan, and the weights already prepared on the GPU for the blocks placed there.
#pragma once
#include <array>
#include <deque>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "ember/model.h"
#include "model/arch/arch.h"
#include "model/host_weights.h"
#include "model/placement.h"

namespace ember {

struct HeadWeights {
    Backend* backend = nullptr;
    Weight output;
    const float* output_norm = nullptr;
};

// Every tensor of the block on `be` (matrices uploaded or bound in place, vectors as floats).
BlockWeights prepare_block(Backend& be, const BlockTensors& t);
// Only the vectors (norm weights, biases); the matrices left empty.
BlockWeights prepare_block_vectors(Backend& be, const BlockTensors& t);
HeadWeights prepare_head(Backend& be, const GGUFTensor& output, const GGUFTensor& output_norm);

struct ModelImpl {
    std::unique_ptr<GGUFFile> file;
    ModelParams params;
    HParams hp;
    const Architecture* arch = nullptr;
    std::vector<LayerConfig> layers;   // [n_layer] rope and attention shape of each layer
    // LongRoPE files (rope_factors_long/short): the layers with the long factors, which runners
    // whose sequences may pass the original context take (layers has the short ones); else empty.
    std::vector<LayerConfig> layers_long;
    const std::vector<LayerConfig>& layers_for(int32_t n_ctx_seq) const {
        return !layers_long.empty() && n_ctx_seq > hp.rope_n_ctx_orig ? layers_long : layers;
    }
    std::unique_ptr<Tokenizer> tokenizer;
    const GGUFTensor* tok_embd = nullptr;
    const GGUFTensor* output_norm = nullptr;
    const GGUFTensor* output = nullptr;   // token_embd when tied
    const GGUFTensor* per_layer_tok_embd = nullptr;   // per-layer embeddings' rows (hp.n_embd_per_layer > 0)
    std::vector<BlockTensors> blocks;
    std::deque<GGUFTensor> row_slices;   // the parts of fused tensors blocks point to (TensorSpec::slice)
    std::array<bool, kRoles> moe_role{};   // the roles a mixture's experts take with them (placement.h)
    PlacementPlan plan;

    std::unique_ptr<Backend> gpu;         // null when every block is on the CPU
    std::vector<BlockWeights> gpu_blocks; // indexed by block; backend null for CPU blocks
    // CPU blocks' vectors on the GPU, where large batches run them on streamed weights
    // (streamed_weights.h); backend null for GPU blocks.
    std::vector<BlockWeights> stream_blocks;
    HeadWeights gpu_head;                 // set whenever the plan puts the head on the GPU
    std::unique_ptr<HostWeights> host_weights;   // use_mmap = false: the CPU matrices' copies

    bool any_gpu() const { return gpu != nullptr; }
};

// Reads the common and the architecture's hyperparameters; throws naming the file and key.
HParams read_hparams(const GGUFFile& f);
// The model's rope (base, scaling, llama 3 frequency divisors) from its hyperparameters.
RopeParams model_rope(const HParams& hp, const std::vector<float>& freq_factors);

}  // namespace ember
