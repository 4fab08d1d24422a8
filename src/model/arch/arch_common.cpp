// The pre-norm llama block (Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE) and the weight views
// the fused ops take.
#include "model/arch/arch_common.h"

#include <cmath>

#include "ember/status.h"
#include "model/arch/moe_common.h"

namespace ember {

std::vector<TensorSpec> llama_block_tensors(const HParams& hp, bool biases, bool qk_norm) {
    const int64_t E = hp.n_embd, F = hp.n_ff, D = hp.head_dim;
    const int64_t QW = (int64_t)hp.n_head * D, KW = (int64_t)hp.n_head_kv * D;
    std::vector<TensorSpec> t = {
        {Role::attn_norm, "attn_norm.weight", {E}}, {Role::wq, "attn_q.weight", {E, QW}},
        {Role::wk, "attn_k.weight", {E, KW}},       {Role::wv, "attn_v.weight", {E, KW}},
        {Role::wo, "attn_output.weight", {QW, E}},  {Role::ffn_norm, "ffn_norm.weight", {E}},
    };
    if (hp.n_expert > 0) {
        for (TensorSpec& s : moe_block_tensors(hp, /*biases=*/false)) t.push_back(std::move(s));
    } else {
        t.push_back({Role::gate, "ffn_gate.weight", {E, F}});
        t.push_back({Role::up, "ffn_up.weight", {E, F}});
        t.push_back({Role::down, "ffn_down.weight", {F, E}});
    }
    if (biases) {
        t.push_back({Role::bq, "attn_q.bias", {QW}, true});
        t.push_back({Role::bk, "attn_k.bias", {KW}, true});
        t.push_back({Role::bv, "attn_v.bias", {KW}, true});
    }
    if (qk_norm) {
        t.push_back({Role::q_norm, "attn_q_norm.weight", {D}});
        t.push_back({Role::k_norm, "attn_k_norm.weight", {D}});
    }
    return t;
}

LayerConfig Architecture::layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const {
    LayerConfig c;
    c.rope = rope;
    const int32_t D = hp.layer_head_dim(l);
    c.shape = AttentionShape{hp.n_head, hp.layer_n_head_kv(l), D, 1.0f / std::sqrt((float)D), 0};
    return c;
}

void read_swa_pattern(const GGUFFile& f, const std::string& arch, int64_t period, HParams& hp) {
    const std::string key = arch + ".attention.sliding_window_pattern";
    hp.swa_layer.assign(hp.n_layer, false);
    const GGUFValue* pat = f.find(key);
    if (pat && pat->type == GGUFType::ARRAY) {
        if ((int64_t)pat->arr.size() != hp.n_layer || pat->elem_type != GGUFType::BOOL)
            fail(f.path(), ": ", key, " must be a period or ", hp.n_layer, " bools, got an array of ", pat->arr.size());
        for (int32_t l = 0; l < hp.n_layer; ++l) hp.swa_layer[l] = pat->arr[l].num.b;
        return;
    }
    if (pat) period = (int64_t)f.get_uint(key);
    if (period <= 0) fail(f.path(), ": ", key, " must be positive, got ", period);
    for (int32_t l = 0; l < hp.n_layer; ++l) hp.swa_layer[l] = l % period < period - 1;
}

AttnInWeights attn_in_weights(const BlockRun& r) {
    AttnInWeights a;
    a.norm = r.w.v(Role::attn_norm);
    a.eps = r.hp.rms_eps;
    a.wq = r.w.m(Role::wq), a.wk = r.w.m(Role::wk), a.wv = r.w.m(Role::wv);
    a.bq = r.w.v(Role::bq), a.bk = r.w.v(Role::bk), a.bv = r.w.v(Role::bv);
    a.q_norm = r.w.v(Role::q_norm), a.k_norm = r.w.v(Role::k_norm);
    a.n_head = r.cfg.shape.n_head, a.n_head_kv = r.cfg.shape.n_head_kv, a.head_dim = r.cfg.shape.head_dim;
    a.rope = r.cfg.use_rope ? &r.cfg.rope : nullptr;
    return a;
}

FfnWeights ffn_weights(const BlockRun& r, Activation act) {
    FfnWeights f;
    f.norm = r.w.v(Role::ffn_norm);
    f.eps = r.hp.rms_eps;
    f.gate = r.w.m(Role::gate), f.up = r.w.m(Role::up), f.down = r.w.m(Role::down);
    f.act = act;
    return f;
}

const float* pre_norm_block(const BlockRun& r, Activation act) {
    r.be.attn_in(attn_in_weights(r), r.x, r.residual, r.n_tok, r.kv, r.buf);
    r.be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), r.n_tok, r.buf, r.out_a);
    if (r.hp.n_expert > 0) run_moe_ffn(r, MoeConfig{MoeGating::softmax, act}, r.out_a, r.out_b);
    else r.be.ffn(ffn_weights(r, act), r.x, r.out_a, r.n_tok, r.buf, r.out_b);
    return r.out_b;
}

const float* sandwich_norm_block(const BlockRun& r, Activation act) {
    const int32_t n = r.n_tok, E = r.hp.n_embd;
    const float eps = r.hp.rms_eps;
    r.be.attn_in(attn_in_weights(r), r.x, r.residual, n, r.kv, r.buf);
    r.be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), n, r.buf, r.out_a);
    r.be.rmsnorm(r.out_a, r.w.v(Role::post_attn_norm), n, E, eps, r.out_b);
    r.be.ffn(ffn_weights(r, act), r.x, r.out_b, n, r.buf, r.out_a);
    r.be.rmsnorm(r.out_a, r.w.v(Role::post_ffn_norm), n, E, eps, r.out_b);
    return r.out_b;
}

void PreNormArch::read_hparams(const GGUFFile& f, HParams& hp) const {
    hp.rope_neox = neox_;
    check_experts(f, hp, experts_ != Experts::none, experts_ == Experts::required);
}

}  // namespace ember
