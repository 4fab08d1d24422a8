// A block's experts that run on another backend than its attention (the block on the GPU, its
// experts on the CPU: --cpu-moe, --n-cpu-moe, -ot exps=CPU, the GPU budget). The hidden state
// crosses to the experts and their output back, once each way per block and step.
#pragma once
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

}  // namespace ember
