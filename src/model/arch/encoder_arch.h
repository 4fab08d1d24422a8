// What an encoder architecture adds to Architecture: the input beyond token_embd (token type and
// absolute position rows, the embedding LayerNorm) and the norm after the last block. Encoder
// (src/model/encoder.cpp) runs these over packed sequences with bidirectional attention.
#pragma once
#include "model/arch/arch.h"

namespace ember {

class EncoderArch : public Architecture {
public:
    bool encoder() const override { return true; }
    // position_embd.weight rows are added at the input (BERT); else positions are rotary.
    virtual bool absolute_positions() const { return false; }
    // token_embd_norm.weight / .bias (a LayerNorm) after the input sum (the BERT family).
    virtual bool input_layernorm() const { return false; }
    // output_norm.weight (an RMSNorm) after the last block (EmbeddingGemma).
    virtual bool output_rmsnorm() const { return false; }
};

// The BERT family's block tensors (attn_q/k/v or a fused attn_qkv, optional biases, the post-norm
// LayerNorms, ffn_up/ffn_down with optional biases, ffn_gate when gated).
std::vector<TensorSpec> bert_block_tensors(const HParams& hp, bool gated);

// The keys the BERT family shares (causal must be false, the LayerNorm epsilon, a fused attn_qkv);
// a file with experts is refused unless `experts`.
void read_encoder_hparams(const GGUFFile& f, HParams& hp, bool experts);

// The post-norm BERT block: x = LayerNorm(x + attention(x)); x = LayerNorm(x + ffn(x)), attention
// bidirectional over the batch's sequences (rotated first when rotary), the feed-forward GELU(up)
// -> down with biases, or SiLU(gate) * up -> down when gated. Leaves its output in x (returns null).
const float* post_norm_encoder_block(const BlockRun& r, bool rotary, bool gated);

// Its halves: x = LayerNorm(x + attention(x)); and, with the feed-forward's output in out_a (before
// the ffn_down bias), x = LayerNorm(x + out_a + bias).
void post_norm_encoder_attention(const BlockRun& r, bool rotary);
void post_norm_encoder_ffn_end(const BlockRun& r);

}  // namespace ember
