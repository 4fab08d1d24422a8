// Internals of a loaded model: hyperparameters, the GGUF tensors of each block, and the weights
// already prepared on the GPU for the blocks placed there.
#pragma once
#include <memory>
#include <vector>

#include "ember/model.h"
#include "backend/backend.h"
#include "model/host_weights.h"

namespace ember {

// The GGUF tensors of one transformer block (biases are null where the architecture has none).
struct BlockTensors {
    const GGUFTensor *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
    const GGUFTensor *bq = nullptr, *bk = nullptr, *bv = nullptr;
};

// A block's weights as one backend sees them.
struct BlockWeights {
    Backend* backend = nullptr;
    Weight wq, wk, wv, wo, w_gate, w_up, w_down;
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
};

struct HeadWeights {
    Backend* backend = nullptr;
    Weight output;
    const float* output_norm = nullptr;
};

BlockWeights prepare_block(Backend& be, const BlockTensors& t);
// Only the norm weights and biases (weights left empty).
BlockWeights prepare_block_vectors(Backend& be, const BlockTensors& t);
HeadWeights prepare_head(Backend& be, const GGUFTensor& output, const GGUFTensor& output_norm);

struct ModelImpl {
    std::unique_ptr<GGUFFile> file;
    ModelParams params;
    HParams hp;
    std::unique_ptr<Tokenizer> tokenizer;
    const GGUFTensor* tok_embd = nullptr;
    const GGUFTensor* output_norm = nullptr;
    const GGUFTensor* output = nullptr;   // token_embd when tied
    std::vector<BlockTensors> blocks;
    std::vector<bool> on_gpu;             // placement per block

    std::unique_ptr<Backend> gpu;         // null when every block is on the CPU
    std::vector<BlockWeights> gpu_blocks; // indexed by block; backend null for CPU blocks
    // CPU blocks' norms and biases on the GPU, where prompt batches run them on streamed weights
    // (context.cpp); backend null for GPU blocks.
    std::vector<BlockWeights> stream_blocks;
    HeadWeights gpu_head;                 // set whenever any block is on the GPU
    std::unique_ptr<HostWeights> host_weights;   // use_mmap = false: the CPU matrices' copies

    bool any_gpu() const { return gpu != nullptr; }
};

// Reads {arch}.* hyperparameters; throws naming the file and key.
HParams read_hparams(const GGUFFile& f);

}  // namespace ember
