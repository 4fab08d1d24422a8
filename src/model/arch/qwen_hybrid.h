// The Qwen hybrid family (qwen35, qwen35moe, qwen3next): gated DeltaNet layers, which keep a
// recurrent state per sequence (RecurrentLayer), beside gated attention layers, each followed by a
// dense SwiGLU feed-forward or by routed experts with a gated shared expert.
#pragma once
#include "model/arch/arch.h"

namespace ember {

// What sets one member of the family apart.
struct QwenHybridKind {
    // Routed experts and a shared expert scaled by sigmoid(ffn_gate_inp_shexp . x) in every block
    // (qwen35moe, qwen3next); else a dense SwiGLU (qwen35).
    bool experts = false;
    // Qwen3-Next's DeltaNet layout: v heads grouped by k head (v head j reads k head j / (n_v / n_k))
    // and beta and alpha in one ssm_ba projection; else Qwen3.5's tiled v heads (j reads j % n_k)
    // with ssm_beta and ssm_alpha apart.
    bool grouped_v = false;
};

class QwenHybridArch : public Architecture {
public:
    explicit QwenHybridArch(QwenHybridKind kind) : kind_(kind) {}
    void read_hparams(const GGUFFile& f, HParams& hp) const override;
    // The attention layers' tensors (layer_tensors gives each layer its own kind's).
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override { return layer_specs(hp, false); }
    std::vector<TensorSpec> layer_tensors(const HParams& hp, int32_t l) const override {
        return layer_specs(hp, hp.recurrent_layer[l]);
    }
    const float* forward_block(const BlockRun& r) const override;
    // Both kinds of layer work in BlockBuffers::recurrent: the gated attention's query and gate, the
    // DeltaNet's projections, convolution and delta-rule rows.
    int64_t recurrent_scratch_floats(const HParams& hp) const override;

private:
    QwenHybridKind kind_;
    std::vector<TensorSpec> layer_specs(const HParams& hp, bool recurrent) const;
    void delta_net(const BlockRun& r, float* out) const;
};

}  // namespace ember
