// The experts' tensors, their MoeWeights view and the call that runs them, shared by every
// mixture architecture (qwen3moe, llama with experts, gpt-oss, qwen35moe, qwen3next).
#include "model/arch/moe_common.h"

#include "ember/status.h"
#include "model/remote_experts.h"

namespace ember {

std::vector<TensorSpec> moe_block_tensors(const HParams& hp, bool biases) {
    const int64_t E = hp.n_embd, F = hp.n_ff_exp, X = hp.n_expert;
    std::vector<TensorSpec> t = {
        {Role::router, "ffn_gate_inp.weight", {E, X}},
        {Role::gate_exps, "ffn_gate_exps.weight", {E, F, X}},
        {Role::up_exps, "ffn_up_exps.weight", {E, F, X}},
        {Role::down_exps, "ffn_down_exps.weight", {F, E, X}},
    };
    if (biases) {
        t.push_back({Role::router_bias, "ffn_gate_inp.bias", {X}});
        t.push_back({Role::gate_exps_bias, "ffn_gate_exps.bias", {F, X}, false, true});
        t.push_back({Role::up_exps_bias, "ffn_up_exps.bias", {F, X}, false, true});
        t.push_back({Role::down_exps_bias, "ffn_down_exps.bias", {E, X}, false, true});
    }
    return t;
}

std::vector<TensorSpec> shared_expert_tensors(const HParams& hp, int64_t n_ff_shexp, bool gated) {
    const int64_t E = hp.n_embd, F = n_ff_shexp;
    std::vector<TensorSpec> t = {
        {Role::gate_shexp, "ffn_gate_shexp.weight", {E, F}},
        {Role::up_shexp, "ffn_up_shexp.weight", {E, F}},
        {Role::down_shexp, "ffn_down_shexp.weight", {F, E}},
    };
    // Stored as llama.cpp's converter writes the checkpoint's [1][n_embd] matrix.
    if (gated) t.push_back({Role::gate_inp_shexp, "ffn_gate_inp_shexp.weight", {E, 1}});
    return t;
}

MoeWeights moe_weights(const BlockWeights& w, const HParams& hp, const MoeConfig& c) {
    MoeWeights m;
    m.router = w.m(Role::router);
    m.router_bias = w.v(Role::router_bias);
    m.gate = w.m(Role::gate_exps), m.up = w.m(Role::up_exps), m.down = w.m(Role::down_exps);
    m.gate_bias = w.v(Role::gate_exps_bias), m.up_bias = w.v(Role::up_exps_bias);
    m.down_bias = w.v(Role::down_exps_bias);
    m.n_expert = hp.n_expert, m.n_used = hp.n_expert_used;
    m.gating = c.gating;
    m.norm_topk = c.gating == MoeGating::softmax && hp.expert_weights_norm;
    m.weight_scale = hp.expert_weights_scale;
    m.act = c.act;
    m.weight_input = c.weight_input;
    if (w.m(Role::gate_shexp)->data)
        m.shared_gate = w.m(Role::gate_shexp), m.shared_up = w.m(Role::up_shexp), m.shared_down = w.m(Role::down_shexp);
    if (w.m(Role::gate_inp_shexp)->data) m.shared_gate_inp = w.m(Role::gate_inp_shexp);
    return m;
}

void run_moe_ffn(const BlockRun& r, const MoeConfig& c, const float* residual, float* out) {
    // Experts placed apart from their block (placement.h) run on their own backend, from its copy
    // of the block's vectors and MoE tensors.
    const BlockWeights& w = r.experts ? r.experts->w : r.w;
    MoeWeights m = moe_weights(w, r.hp, c);
    m.norm = w.v(Role::ffn_norm);
    m.eps = r.hp.rms_eps;
    if (r.experts) moe_ffn_remote(r, m, residual, out);
    else r.be.moe_ffn(m, r.x, residual, r.n_tok, r.buf, out);
}

void check_experts(const GGUFFile& f, const HParams& hp, bool allowed, bool required) {
    if (hp.n_expert > 0 && !allowed)
        fail(f.path(), ": ", hp.arch, ".expert_count is ", hp.n_expert, " but ", hp.arch,
             " has no mixture-of-experts layers");
    if (hp.n_expert == 0 && required)
        fail(f.path(), ": ", hp.arch, " needs ", hp.arch, ".expert_count and ", hp.arch, ".expert_used_count");
}

}  // namespace ember
