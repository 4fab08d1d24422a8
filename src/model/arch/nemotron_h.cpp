// Nemotron-H (nemotron_h: Nemotron-H, Nemotron Nano 2; nemotron_h_moe: Nemotron 3): each layer one
// mixer after an RMSNorm, added to the residual stream: a Mamba2 layer (state per sequence), an
// attention layer without rope, or a squared-ReLU MLP, which nemotron_h_moe's are mixtures of
// (sigmoid-scored experts beside a shared expert). The kinds as llama.cpp reads them from the
// per-layer head_count_kv and feed_forward_length: both 0 is Mamba2, a feed-forward width an MLP,
// else attention.
#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/mamba2_common.h"
#include "model/arch/moe_common.h"

namespace ember {

namespace {

class NemotronHArch : public Architecture {
public:
    explicit NemotronHArch(bool moe) : moe_(moe) {}

    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        const std::string a = hp.arch + ".";
        check_experts(f, hp, moe_, moe_);
        if (moe_) {
            // The experts are expert_feed_forward_length wide (n_ff_exp); the shared expert takes hp.n_ff.
            hp.n_ff = (int32_t)f.get_uint(a + "expert_shared_feed_forward_length");
            if (hp.n_ff <= 0)
                fail(f.path(), ": ", a, "expert_shared_feed_forward_length must be positive, got ", hp.n_ff);
            if (f.get_uint(a + "moe_latent_size", 0) != 0)
                fail(f.path(), ": ", a, "moe_latent_size: experts in a latent space are not supported");
            if (f.get_uint(a + "expert_group_count", 1) > 1)
                fail(f.path(), ": ", a, "expert_group_count above 1 (group-limited routing) is not supported");
        }
        // llama.cpp reads the RMS epsilon under layer_norm_epsilon where layer_norm_rms_epsilon is absent.
        if (!f.find(a + "attention.layer_norm_rms_epsilon"))
            hp.rms_eps = (float)f.get_float(a + "attention.layer_norm_epsilon", 1e-5);
        read_mamba2_hparams(f, hp);
        hp.recurrent_layer.assign(hp.n_layer, false);
        for (int32_t l = 0; l < hp.n_layer; ++l)
            hp.recurrent_layer[l] = hp.layer_n_head_kv(l) == 0 && hp.layer_n_ff(l) == 0;
    }

    bool layer_attends(const HParams& hp, int32_t l) const override {
        return !hp.recurrent_layer[l] && hp.layer_n_ff(l) == 0;
    }
    bool layer_has_ffn(const HParams& hp, int32_t l) const override { return hp.layer_n_ff(l) > 0; }

    std::vector<TensorSpec> block_tensors(const HParams& hp) const override { return attention_specs(hp); }
    std::vector<TensorSpec> layer_tensors(const HParams& hp, int32_t l) const override {
        if (hp.recurrent_layer[l]) {
            std::vector<TensorSpec> t = mamba2_tensors(hp);
            t.insert(t.begin(), {Role::attn_norm, "attn_norm.weight", {hp.n_embd}});
            return t;
        }
        if (hp.layer_n_ff(l) == 0) return attention_specs(hp);
        const int64_t E = hp.n_embd, F = hp.layer_n_ff(l), FX = hp.n_ff_exp, FS = hp.n_ff, X = hp.n_expert;
        if (!moe_)
            return {{Role::attn_norm, "attn_norm.weight", {E}},
                    {Role::up, "ffn_up.weight", {E, F}},
                    {Role::down, "ffn_down.weight", {F, E}}};
        return {{Role::attn_norm, "attn_norm.weight", {E}},
                {Role::router, "ffn_gate_inp.weight", {E, X}},
                {Role::exp_probs_b, "exp_probs_b.bias", {X}},
                {Role::up_exps, "ffn_up_exps.weight", {E, FX, X}},
                {Role::down_exps, "ffn_down_exps.weight", {FX, E, X}},
                {Role::up_shexp, "ffn_up_shexp.weight", {E, FS}},
                {Role::down_shexp, "ffn_down_shexp.weight", {FS, E}}};
    }

    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        c.use_rope = false;
        return c;
    }

    std::string cpu_only(const GGUFFile& f) const override {
        (void)f;
        return moe_ ? "its experts are squared-ReLU MLPs without a gate, which Backend::moe's gated experts are not, "
                      "so their routing and rows go through host memory"
                    : "";
    }
    int64_t recurrent_scratch_floats(const HParams& hp) const override { return mamba2_scratch_floats(hp); }
    const float* forward_block(const BlockRun& r) const override {
        const int32_t n = r.n_tok;
        const bool mlp = r.w.m(moe_ ? Role::up_shexp : Role::up)->n_out > 0;
        if (r.state) {
            r.be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), n, r.hp.n_embd, r.hp.rms_eps, r.buf.xn);
            mamba2_mixer(r, r.out_a);
        } else if (!mlp) {
            r.be.attn_in(attn_in_weights(r), r.x, r.residual, n, r.kv, r.buf);
            r.be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), n, r.buf, r.out_a);
        } else {
            r.be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), n, r.hp.n_embd, r.hp.rms_eps, r.buf.xn);
            if (moe_) mixture(r, r.out_a);
            else relu2_mlp(r, *r.w.m(Role::up), *r.w.m(Role::down), r.buf.xn, n, r.out_a);
        }
        return r.out_a;
    }

private:
    bool moe_;

    // out = down(relu(up x)^2) of n rows x.
    static void relu2_mlp(const BlockRun& r, const Weight& up, const Weight& down, const float* x, int32_t n,
                          float* out) {
        float* h = r.buf.up;
        r.be.matmul(up, x, n, h);
        r.be.unary(UnaryOp::ReLUSquared, h, (int64_t)n * up.n_out);
        r.be.matmul(down, h, n, out);
    }

    // The mixture on the normed rows r.buf.xn: the shared expert, plus the experts chosen by sigmoid
    // score + exp_probs_b, weighted by their scores (renormalized, scaled) as llama.cpp's; every
    // expert a squared-ReLU MLP, which the contract's gated experts are not.
    static void mixture(const BlockRun& r, float* out) {
        const HParams& hp = r.hp;
        const int32_t n = r.n_tok, X = hp.n_expert, U = hp.n_expert_used;
        const int64_t E = hp.n_embd;
        relu2_mlp(r, *r.w.m(Role::up_shexp), *r.w.m(Role::down_shexp), r.buf.xn, n, out);
        MoeWeights m;
        m.router = r.w.m(Role::router);
        m.selection_bias = r.w.v(Role::exp_probs_b);
        m.n_expert = X, m.n_used = U;
        m.gating = MoeGating::sigmoid;
        m.norm_topk = hp.expert_weights_norm;
        m.weight_scale = hp.expert_weights_scale;
        std::vector<float> logits((size_t)n * X), weights((size_t)n * U);
        std::vector<int32_t> ids((size_t)n * U);
        r.be.matmul(*m.router, r.buf.xn, n, logits.data());
        r.be.moe_route(m, logits.data(), n, ids.data(), weights.data());
        const MoeGroups g = moe_groups(ids.data(), weights.data(), n, U, X);
        std::vector<float> xe((size_t)n * E), ye((size_t)n * E);
        const Weight &up = *r.w.m(Role::up_exps), &down = *r.w.m(Role::down_exps);
        for (int32_t e = 0; e < X; ++e) {
            const int64_t at = g.first[e];
            const int32_t c = (int32_t)(g.first[e + 1] - at);
            if (c == 0) continue;
            r.be.gather_rows(r.buf.xn, &g.tok[at], c, E, xe.data());
            relu2_mlp(r, expert_matrix(up, e), expert_matrix(down, e), xe.data(), c, ye.data());
            r.be.scatter_add_rows(out, ye.data(), &g.tok[at], &g.weight[at], c, E);
        }
    }

    static std::vector<TensorSpec> attention_specs(const HParams& hp) {
        const int64_t E = hp.n_embd, D = hp.head_dim;
        const int64_t QW = (int64_t)hp.n_head * D, KW = (int64_t)hp.n_head_kv * D;
        return {{Role::attn_norm, "attn_norm.weight", {E}},
                {Role::wq, "attn_q.weight", {E, QW}},
                {Role::wk, "attn_k.weight", {E, KW}},
                {Role::wv, "attn_v.weight", {E, KW}},
                {Role::wo, "attn_output.weight", {QW, E}}};
    }
};

}  // namespace

const Architecture& nemotron_h_architecture() {
    static const NemotronHArch arch(false);
    return arch;
}

const Architecture& nemotron_h_moe_architecture() {
    static const NemotronHArch arch(true);
    return arch;
}

}  // namespace ember
