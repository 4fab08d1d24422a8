// Pieces several architectures share: the pre-norm llama block's tensor list and forward, and
// the fused ops' weight views of a block.
#pragma once
#include "model/arch/arch.h"

namespace ember {

// attn_norm, attn_q/k/v (+ biases when `biases`: optional), attn_q_norm/attn_k_norm when
// `qk_norm`, attn_output, ffn_norm, ffn_gate/up/down.
std::vector<TensorSpec> llama_block_tensors(const HParams& hp, bool biases, bool qk_norm);

AttnInWeights attn_in_weights(const BlockRun& r);
FfnWeights ffn_weights(const BlockRun& r, Activation act);

// x += attn(norm(x)); x += ffn(norm(x)), with the second addition left to the caller (returned).
const float* pre_norm_block(const BlockRun& r, Activation act);

}  // namespace ember
