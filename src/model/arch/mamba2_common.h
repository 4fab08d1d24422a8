// Mamba2 layers as the hybrids that have them (Nemotron-H, Granite 4) share them: their GGUF keys,
// their tensors and their mixer over the backend contract, the convolution and scan states carried
// in each sequence's slot (RecurrentLayer).
#pragma once
#include "model/arch/arch.h"

namespace ember {

// {arch}.ssm.* into hp's ssm_* fields as qwen35 reads the same keys: group_count -> ssm_k_heads,
// time_step_rank (the heads) -> ssm_v_heads, state_size -> ssm_head_k, inner_size / heads ->
// ssm_head_v. RecurrentState then sizes a slot as the convolution's x, B and C channels and the
// scan's [n_head][head_dim][d_state].
void read_mamba2_hparams(const GGUFFile& f, HParams& hp);

// A Mamba2 layer's tensors besides the norm before it: ssm_in (z, xBC and dt as row slices),
// ssm_conv1d (+ optional bias), ssm_dt.bias, ssm_a, ssm_d, ssm_norm (grouped), ssm_out.
std::vector<TensorSpec> mamba2_tensors(const HParams& hp);

// Floats per token of BlockBuffers::recurrent mamba2_mixer works in (Architecture::recurrent_scratch_floats).
int64_t mamba2_scratch_floats(const HParams& hp);

// out = ssm_out(grouped_rmsnorm(scan(conv(xBC)) * silu(z))) of the normed rows r.buf.xn, each
// sequence of the batch on its own state slot, in r.buf.recurrent; backend ops only.
void mamba2_mixer(const BlockRun& r, float* out);

}  // namespace ember
