// A mixture-of-experts feed-forward as the architectures call it: the tensors of a block's
// experts, their MoeWeights view, and the one call that runs them (where the experts run is
// decided there and nowhere else).
#pragma once
#include "model/arch/arch.h"

namespace ember {

// How an architecture routes its tokens and activates its experts.
struct MoeConfig {
    MoeGating gating = MoeGating::softmax;
    Activation act = Activation::SiLU;
    bool weight_input = false;   // MoeWeights::weight_input (llama 4)
};

// ffn_gate_inp (the router) and the stacked ffn_{gate,up,down}_exps; with `biases` also the
// router's and the experts' biases (gpt-oss). The norm before them is the caller's. A shared
// expert (Role::gate_shexp, ...) is the architecture's to list; moe_weights takes it where present.
std::vector<TensorSpec> moe_block_tensors(const HParams& hp, bool biases);

// A shared expert of width n_ff_shexp every token runs (Role::gate_shexp, ...); with `gated` also
// ffn_gate_inp_shexp, whose sigmoid scales its output (MoeWeights::shared_gate_inp).
std::vector<TensorSpec> shared_expert_tensors(const HParams& hp, int64_t n_ff_shexp, bool gated);

// The experts of any block's weights (the block's own, or a copy of its experts on another
// backend); norm and eps are left for the caller, who knows where the norm lives.
MoeWeights moe_weights(const BlockWeights& w, const HParams& hp, const MoeConfig& c);

// x += residual; out = experts(rmsnorm(x) * ffn_norm).
void run_moe_ffn(const BlockRun& r, const MoeConfig& c, const float* residual, float* out);

// Refuses a file whose expert keys do not fit its architecture (experts where it has none, or
// none where it must have them), naming the file and the key.
void check_experts(const GGUFFile& f, const HParams& hp, bool allowed, bool required);

}  // namespace ember
