// A block's experts that run on another backend than its attention (the block on the GPU, its
// experts on the CPU: --cpu-moe, --n-cpu-moe, -ot exps=CPU, the GPU budget). The hidden state
// crosses to the experts and their output back, once each way per block and step; large batches
// instead run those experts on the GPU, on weights uploaded for the step (ExpertStream).
#pragma once
#include <memory>
#include <vector>

#include "model/arch/arch.h"

namespace ember {

struct RemoteExperts {
    Backend* be = nullptr;                // where the experts run (host memory: the CPU backend)
    BlockWeights w;                       // the block's vectors and MoE matrices on be
    const BlockBuffers* buf = nullptr;    // be's scratch
    float *x = nullptr, *out = nullptr;   // [n_batch][n_embd], pinned for the block's backend's copies
};

// The block's MoE feed-forward with its experts on r.experts: x += residual on the block's
// backend; then x to the experts' backend, where m (the view of r.experts->w, norm included) runs
// as moe_ffn; its output back into out on the block's backend.
void moe_ffn_remote(const BlockRun& r, const MoeWeights& m, const float* residual, float* out);

// llama.cpp's op offload for experts: a batch of at least kMinTokens runs the CPU experts of GPU
// blocks on the GPU, their matrices uploaded into one of two staging sets while the other set's
// block computes, so the experts' bytes cross PCIe once a step instead of the CPU computing every
// token's. Any batch (the engine's steps too): no KV moves.
class ExpertStream {
public:
    static constexpr int32_t kMinTokens = 32;   // as streamed_weights.h's: above the graph sizes

    // Staging for the MoE matrices of remote's blocks (be set); null when the GPU cannot hold it
    // (the experts then stay on the CPU for every batch).
    static std::unique_ptr<ExpertStream> open(Backend& gpu, const std::vector<RemoteExperts>& remote,
                                              HostParallelFor parallel_for, bool verbose);

    // Block l of a streamed step: gpu_w (the block's own weights, MoE vectors included) with its
    // MoE matrices staged on the GPU.
    BlockWeights begin_block(int32_t l, const BlockWeights& gpu_w);
    // After block l's ops; `next` is the next block whose experts stream (-1: none), whose upload starts.
    void end_block(int32_t l, int32_t next);

private:
    explicit ExpertStream(std::unique_ptr<WeightStream> s) : stream_(std::move(s)) {}
    std::unique_ptr<WeightStream> stream_;
    std::vector<std::vector<int>> roles_;   // [n_layer] the role of each matrix an upload returns
    std::vector<Weight> staged_;            // the next block's matrices, already uploading
};

}  // namespace ember
