// Multi-head latent attention (DeepSeek V2/V3) in its absorbed form over the backend contract: its
// tensors, and the attention of a block whose cache keeps a token's rotated key part and normed
// latent once (one KV head), with the queries taken into the latent space.
#pragma once
#include "model/arch/arch.h"

namespace ember {

// attn_norm, the queries' projections (attn_q, or attn_q_a, attn_q_a_norm and attn_q_b), attn_kv_a_mqa,
// attn_kv_a_norm, attn_k_b, attn_v_b and attn_output.
std::vector<TensorSpec> mla_tensors(const HParams& hp);

// Refuses latent-attention hyperparameters the cache layout cannot hold, naming the key.
void check_mla_hparams(const GGUFFile& f, const HParams& hp);

// x += residual; out = the latent attention of rmsnorm(x) * attn_norm. Cache rows and absorbed
// queries are [n_rot | kv_lora_rank]: the rotated part first, so that rope turns it in place.
void mla_attention(const BlockRun& r, float* out);

}  // namespace ember
