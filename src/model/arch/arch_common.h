// Pieces several architectures share: the pre-norm llama block's tensor list and forward, and
// the fused ops' weight views of a block.
#pragma once
#include "model/arch/arch.h"

namespace ember {

// attn_norm, attn_q/k/v (+ biases when `biases`: optional), attn_q_norm/attn_k_norm when
// `qk_norm`, attn_output, ffn_norm, and ffn_gate/up/down, or the experts (moe_common.h) when the
// file has them (hp.n_expert > 0).
std::vector<TensorSpec> llama_block_tensors(const HParams& hp, bool biases, bool qk_norm);

AttnInWeights attn_in_weights(const BlockRun& r);

// hp.swa_layer from {arch}.attention.sliding_window_pattern as llama.cpp reads it: one bool per
// layer, or a period p (layer l slides when l % p < p - 1), `period` when the key is absent.
void read_swa_pattern(const GGUFFile& f, const std::string& arch, int64_t period, HParams& hp);
FfnWeights ffn_weights(const BlockRun& r, Activation act);

// x += attn(norm(x)); x += ffn(norm(x)) (a mixture's experts when hp.n_expert > 0, with softmax
// routing), with the second addition left to the caller (returned).
const float* pre_norm_block(const BlockRun& r, Activation act);

// Sandwich norms (Gemma 2 and 3, GLM-4): x += post_attn_norm(attn(norm(x))), then the returned
// post_ffn_norm(ffn(ffn_norm(x))) is left to the caller to add.
const float* sandwich_norm_block(const BlockRun& r, Activation act);

// Whether an architecture's files have experts: never, as the file says, or always.
enum class Experts { none, optional, required };

// The pre-norm llama family with a SwiGLU feed-forward or a mixture of SwiGLU experts; members
// differ in the rope layout, Q/K/V biases, per-head q/k norms and experts (llama.cpp, qwen2.cpp,
// qwen3.cpp, qwen3moe.cpp each make one).
class PreNormArch : public Architecture {
public:
    PreNormArch(bool neox, bool biases, bool qk_norm, Experts experts = Experts::none)
        : neox_(neox), biases_(biases), qk_norm_(qk_norm), experts_(experts) {}
    void read_hparams(const GGUFFile& f, HParams& hp) const override;
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        return llama_block_tensors(hp, biases_, qk_norm_);
    }
    const float* forward_block(const BlockRun& r) const override { return pre_norm_block(r, Activation::SiLU); }

private:
    bool neox_, biases_, qk_norm_;
    Experts experts_;
};

}  // namespace ember
