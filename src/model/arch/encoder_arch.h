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

// The post-norm BERT block: x = LayerNorm(x + attention(x)); x = LayerNorm(x + ffn(x)), attention
// bidirectional over the batch's sequences (rotated first when rotary), the feed-forward GELU(up)
// -> down with biases, or SiLU(gate) * up -> down when gated. Leaves its output in x (returns null).
const float* post_norm_encoder_block(const BlockRun& r, bool rotary, bool gated);

}  // namespace ember
