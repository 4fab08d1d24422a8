// The Qwen hybrid family's hyperparameters, tensors and block forward (qwen_hybrid.h), over the
// tensors as llama.cpp's converter writes them.
#include "model/arch/qwen_hybrid.h"

#include <algorithm>

#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

namespace {

// Widths of a gated DeltaNet layer.
struct DeltaNetDims {
    int32_t n_k, n_v, dk, dv, kernel;
    int32_t key_dim() const { return n_k * dk; }
    int32_t value_dim() const { return n_v * dv; }
    int32_t channels() const { return 2 * key_dim() + value_dim(); }   // q, k and v through the convolution
};

DeltaNetDims dims(const HParams& hp) {
    return {hp.ssm_k_heads, hp.ssm_v_heads, hp.ssm_head_k, hp.ssm_head_v, hp.ssm_conv_kernel};
}

// out = wo((attention of q over the KV) * sigmoid(gate)), q and the gate from one projection
// that gives each head its query then its gate; both in r.buf.recurrent.
void gated_attention(const BlockRun& r, float* out) {
    const HParams& hp = r.hp;
    const int32_t n = r.n_tok, H = hp.n_head, D = hp.head_dim;
    const int64_t QW = (int64_t)H * D;
    float* qg = r.buf.recurrent;
    float* gate = qg + (int64_t)n * 2 * QW;
    const Weight* ws[3] = {r.w.m(Role::wq), r.w.m(Role::wk), r.w.m(Role::wv)};
    float* ys[3] = {qg, r.buf.k, r.buf.v};
    r.be.matmul_many(ws, ys, 3, r.buf.xn, n);
    r.be.copy_rows(r.buf.q, D, qg, 2 * D, D, (int64_t)n * H);
    r.be.copy_rows(gate, D, qg + D, 2 * D, D, (int64_t)n * H);
    r.be.head_rmsnorm(r.buf.q, r.w.v(Role::q_norm), n, H, D, hp.rms_eps);
    r.be.head_rmsnorm(r.buf.k, r.w.v(Role::k_norm), n, hp.n_head_kv, D, hp.rms_eps);
    r.be.rope(r.buf.q, n, H, r.cfg.rope);
    r.be.rope(r.buf.k, n, hp.n_head_kv, r.cfg.rope);
    r.be.kv_store(r.kv, r.buf.k, r.buf.v, n);
    r.be.attention(r.kv, r.buf.q, n, r.cfg.shape, r.buf.att);
    r.be.sigmoid(gate, (int64_t)n * QW);
    r.be.mul(r.buf.att, gate, (int64_t)n * QW);
    r.be.matmul(*r.w.m(Role::wo), r.buf.att, n, out);
}

// Widths of q and k as the delta rule reads them: n_k heads, or Qwen3-Next's k heads repeated
// into place, one per v head.
int64_t delta_qk_width(const DeltaNetDims& d, bool grouped_v) { return (int64_t)(grouped_v ? d.n_v : d.n_k) * d.dk; }

}  // namespace

void QwenHybridArch::read_hparams(const GGUFFile& f, HParams& hp) const {
    const std::string a = hp.arch + ".";
    hp.rope_neox = true;   // qwen35's interleaved M-RoPE gives a text token one position in every section
    check_experts(f, hp, kind_.experts, kind_.experts);
    // The mixture blocks have no dense feed-forward: n_ff is their shared expert's width, as llama.cpp
    // reads it (expert_shared_feed_forward_length, else feed_forward_length).
    if (kind_.experts) hp.n_ff = (int32_t)f.get_uint(a + "expert_shared_feed_forward_length", hp.n_ff);
    hp.n_layer_nextn = (int32_t)f.get_uint(a + "nextn_predict_layers", 0);
    if (hp.n_layer_nextn < 0 || hp.n_layer_nextn >= hp.n_layer)
        fail(f.path(), ": ", a, "nextn_predict_layers ", hp.n_layer_nextn, " must be below block_count ", hp.n_layer);
    const int32_t n_all = hp.n_layer;
    hp.n_layer -= hp.n_layer_nextn;
    hp.ssm_conv_kernel = (int32_t)f.get_uint(a + "ssm.conv_kernel");
    hp.ssm_head_k = (int32_t)f.get_uint(a + "ssm.state_size");
    hp.ssm_k_heads = (int32_t)f.get_uint(a + "ssm.group_count");
    hp.ssm_v_heads = (int32_t)f.get_uint(a + "ssm.time_step_rank");
    const int64_t inner = (int64_t)f.get_uint(a + "ssm.inner_size");
    if (hp.ssm_conv_kernel <= 0 || hp.ssm_head_k <= 0 || hp.ssm_k_heads <= 0 || hp.ssm_v_heads <= 0 || inner <= 0 ||
        inner % hp.ssm_v_heads != 0 || hp.ssm_v_heads % hp.ssm_k_heads != 0)
        fail(f.path(), ": ", a, "ssm.* must be positive, inner_size (", inner, ") a multiple of time_step_rank (",
             hp.ssm_v_heads, ") and that of group_count (", hp.ssm_k_heads, "); conv_kernel ", hp.ssm_conv_kernel,
             ", state_size ", hp.ssm_head_k);
    hp.ssm_head_v = (int32_t)(inner / hp.ssm_v_heads);
    const std::string key = a + "attention.recurrent_layers";
    hp.recurrent_layer.assign(hp.n_layer, false);
    if (const GGUFValue* v = f.find(key)) {
        if (v->type != GGUFType::ARRAY || v->elem_type != GGUFType::BOOL || (int32_t)v->arr.size() != n_all)
            fail(f.path(), ": ", key, " must be ", n_all, " bools (block_count)");
        for (int32_t l = 0; l < hp.n_layer; ++l) hp.recurrent_layer[l] = v->arr[l].num.b;
    } else {
        const int64_t every = (int64_t)f.get_uint(a + "full_attention_interval", 4);
        if (every <= 0) fail(f.path(), ": ", a, "full_attention_interval must be positive, got ", every);
        for (int32_t l = 0; l < hp.n_layer; ++l) hp.recurrent_layer[l] = (l + 1) % every != 0;
    }
}

std::vector<TensorSpec> QwenHybridArch::layer_specs(const HParams& hp, bool recurrent) const {
    const int64_t E = hp.n_embd, F = hp.n_ff, D = hp.head_dim;
    const int64_t QW = (int64_t)hp.n_head * D, KW = (int64_t)hp.n_head_kv * D;
    std::vector<TensorSpec> t = {{Role::attn_norm, "attn_norm.weight", {E}},
                                 {Role::ffn_norm, "post_attention_norm.weight", {E}}};
    if (kind_.experts) {
        for (TensorSpec& s : moe_block_tensors(hp, /*biases=*/false)) t.push_back(std::move(s));
        for (TensorSpec& s : shared_expert_tensors(hp, F, /*gated=*/true)) t.push_back(std::move(s));
    } else {
        for (TensorSpec s : std::vector<TensorSpec>{{Role::gate, "ffn_gate.weight", {E, F}},
                                                    {Role::up, "ffn_up.weight", {E, F}},
                                                    {Role::down, "ffn_down.weight", {F, E}}})
            t.push_back(s);
    }
    if (!recurrent) {
        for (TensorSpec s : std::vector<TensorSpec>{{Role::wq, "attn_q.weight", {E, 2 * QW}},
                                                    {Role::wk, "attn_k.weight", {E, KW}},
                                                    {Role::wv, "attn_v.weight", {E, KW}},
                                                    {Role::wo, "attn_output.weight", {QW, E}},
                                                    {Role::q_norm, "attn_q_norm.weight", {D}},
                                                    {Role::k_norm, "attn_k_norm.weight", {D}}})
            t.push_back(s);
        return t;
    }
    const DeltaNetDims d = dims(hp);
    const int64_t C = d.channels(), V = d.value_dim(), H = d.n_v;
    TensorSpec conv{Role::ssm_conv, "ssm_conv1d.weight", {d.kernel, C}};
    conv.vector = true;
    for (TensorSpec s : std::vector<TensorSpec>{{Role::ssm_in, "attn_qkv.weight", {E, C}},
                                                {Role::ssm_gate, "attn_gate.weight", {E, V}},
                                                conv,
                                                {Role::ssm_dt, "ssm_dt.bias", {H}},
                                                {Role::ssm_a, "ssm_a", {H}},
                                                {Role::ssm_norm, "ssm_norm.weight", {d.dv}},
                                                {Role::ssm_out, "ssm_out.weight", {V, E}}})
        t.push_back(s);
    // Qwen3-Next's ssm_ba (each k head's v heads' b, then their a) is bound as ssm_beta.
    if (kind_.grouped_v) t.push_back({Role::ssm_beta, "ssm_ba.weight", {E, 2 * H}});
    else {
        t.push_back({Role::ssm_beta, "ssm_beta.weight", {E, H}});
        t.push_back({Role::ssm_alpha, "ssm_alpha.weight", {E, H}});
    }
    return t;
}

int64_t QwenHybridArch::recurrent_scratch_floats(const HParams& hp) const {
    const DeltaNetDims d = dims(hp);
    const int64_t delta = 2 * d.channels() + 4 * d.value_dim() + 4 * d.n_v + 2 * delta_qk_width(d, kind_.grouped_v) +
                          (kind_.grouped_v ? d.key_dim() : 0);
    return std::max(delta, 3 * (int64_t)hp.n_head * hp.head_dim);
}

const float* QwenHybridArch::forward_block(const BlockRun& r) const {
    if (!r.buf.recurrent) fail(r.hp.arch, ": its blocks need BlockBuffers::recurrent (recurrent_scratch_floats)");
    r.be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), r.n_tok, r.hp.n_embd, r.hp.rms_eps, r.buf.xn);
    if (r.state) delta_net(r, r.out_a);
    else gated_attention(r, r.out_a);
    if (kind_.experts) run_moe_ffn(r, MoeConfig{}, r.out_a, r.out_b);
    else r.be.ffn(ffn_weights(r, Activation::SiLU), r.x, r.out_a, r.n_tok, r.buf, r.out_b);
    return r.out_b;
}

// out = ssm_out(rmsnorm(delta rule over the convolved q, k, v) * silu(z)), the convolution and
// delta-rule states carried in each sequence's slot; the activations in r.buf.recurrent.
void QwenHybridArch::delta_net(const BlockRun& r, float* out) const {
    const DeltaNetDims d = dims(r.hp);
    const int32_t n = r.n_tok, H = d.n_v, per_k = H / d.n_k;
    const int64_t C = d.channels(), K = d.key_dim(), V = d.value_dim(), KQ = delta_qk_width(d, kind_.grouped_v);
    float* mixed = r.buf.recurrent;
    float* conv = mixed + n * C;
    float* z = conv + n * C;
    float* o = z + n * V;
    float* v = o + n * V;
    float* beta = v + n * V;
    float* g = beta + n * H;
    float* ba = g + n * H;   // [n][2 H]
    float* q = ba + n * 2 * H;
    float* k = q + n * KQ;
    float* spread = k + n * KQ;   // [n][K], grouped v heads only
    if (kind_.grouped_v) {
        const Weight* ws[3] = {r.w.m(Role::ssm_in), r.w.m(Role::ssm_gate), r.w.m(Role::ssm_beta)};
        float* ys[3] = {mixed, z, ba};
        r.be.matmul_many(ws, ys, 3, r.buf.xn, n);
        // Each k head's row of ba holds its v heads' b, then their a.
        r.be.copy_rows(beta, per_k, ba, 2 * per_k, per_k, (int64_t)n * d.n_k);
        r.be.copy_rows(g, per_k, ba + per_k, 2 * per_k, per_k, (int64_t)n * d.n_k);
    } else {
        const Weight* ws[4] = {r.w.m(Role::ssm_in), r.w.m(Role::ssm_gate), r.w.m(Role::ssm_beta),
                               r.w.m(Role::ssm_alpha)};
        float* ys[4] = {mixed, z, beta, g};
        r.be.matmul_many(ws, ys, 4, r.buf.xn, n);
    }
    r.be.sigmoid(beta, (int64_t)n * H);
    r.be.softplus_gate(g, r.w.v(Role::ssm_dt), r.w.v(Role::ssm_a), n, H);
    const BatchInfo& b = *r.batch;
    // Each run of one sequence's tokens, in order, through its slot (the convolution's and the delta
    // rule's states are apart, so every run's convolution may go first).
    auto each_run = [&](auto&& fn) {
        for (int32_t t0 = 0; t0 < n;) {
            int32_t t1 = t0 + 1;
            while (t1 < n && b.seq[t1] == b.seq[t0]) ++t1;
            fn(t0, t1 - t0, b.state_slot[b.seq[t0]]);
            t0 = t1;
        }
    };
    each_run([&](int32_t t0, int32_t len, int32_t slot) {
        r.be.short_conv(mixed + t0 * C, r.w.v(Role::ssm_conv), nullptr, len, (int32_t)C, d.kernel, true,
                        r.state->conv_of(slot), conv + t0 * C);
    });
    if (kind_.grouped_v) {
        // The delta rule reads k head h % n_k for v head h: grouped v heads get their k head repeated
        // into place, one per v head.
        for (int32_t part = 0; part < 2; ++part) {
            float* dst = part == 0 ? q : k;
            r.be.copy_rows(spread, K, conv + part * K, C, K, n);
            for (int32_t i = 0; i < per_k; ++i)
                r.be.copy_rows(dst + (int64_t)i * d.dk, (int64_t)per_k * d.dk, spread, d.dk, d.dk, (int64_t)n * d.n_k);
        }
    } else {
        r.be.copy_rows(q, K, conv, C, K, n);
        r.be.copy_rows(k, K, conv + K, C, K, n);
    }
    r.be.copy_rows(v, V, conv + 2 * K, C, V, n);
    const DeltaRuleShape shape{(int32_t)(KQ / d.dk), H, d.dk, d.dv};
    each_run([&](int32_t t0, int32_t len, int32_t slot) {
        r.be.gated_delta_rule(q + t0 * KQ, k + t0 * KQ, v + t0 * V, g + t0 * H, beta + t0 * H, len, shape,
                              r.state->ssm_of(slot), o + t0 * V);
    });
    r.be.head_rmsnorm(o, r.w.v(Role::ssm_norm), n, H, d.dv, r.hp.rms_eps);
    r.be.gated_act(Activation::SiLU, z, o, (int64_t)n * V, o);
    r.be.matmul(*r.w.m(Role::ssm_out), o, n, out);
}

}  // namespace ember
