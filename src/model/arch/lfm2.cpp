// LFM2 (Liquid): a hybrid of short-convolution layers, which keep each sequence's last inputs as
// recurrent state (RecurrentLayer), and GQA attention layers with per-head q/k RMSNorms, each
// followed by a SwiGLU feed-forward; LFM2-MoE (lfm2moe) makes the feed-forwards after the first
// leading_dense_block_count a mixture (sigmoid scores chosen with a selection bias, renormalized).
// The tensors and keys as llama.cpp's converter writes them.
#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"
#include "model/remote_experts.h"

namespace ember {

namespace {

class Lfm2Arch : public Architecture {
public:
    explicit Lfm2Arch(bool moe) : moe_(moe) {}

    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        const std::string a = hp.arch + ".";
        hp.rope_neox = true;
        check_experts(f, hp, moe_, moe_);
        if (moe_) {
            hp.n_layer_dense_lead = (int32_t)f.get_uint(a + "leading_dense_block_count", 0);
            if (hp.n_layer_dense_lead > hp.n_layer)
                fail(f.path(), ": ", a, "leading_dense_block_count ", hp.n_layer_dense_lead, " exceeds block_count ",
                     hp.n_layer);
            const uint64_t gating = f.get_uint(a + "expert_gating_func");
            if (gating != 2) fail(f.path(), ": ", a, "expert_gating_func ", gating, " is not supported (2: sigmoid)");
        }
        hp.ssm_conv_kernel = (int32_t)f.get_uint(a + "shortconv.l_cache");
        if (hp.ssm_conv_kernel < 2)
            fail(f.path(), ": ", a, "shortconv.l_cache must be at least 2, got ", hp.ssm_conv_kernel);
        if (f.get_uint(a + "attention.sliding_window", 0) != 0)
            fail(f.path(), ": ", a, "attention.sliding_window is not supported for ", hp.arch);
        // llama.cpp marks the convolution layers by 0 KV heads in a per-layer head_count_kv.
        hp.recurrent_layer.assign(hp.n_layer, false);
        for (int32_t l = 0; l < hp.n_layer; ++l) hp.recurrent_layer[l] = hp.layer_n_head_kv(l) == 0;
        // RecurrentState sizes a slot as a gated DeltaNet's: the convolution over n_embd channels is
        // one v head of that width with no k heads, and there is no scan state.
        hp.ssm_k_heads = 0, hp.ssm_head_k = 0;
        hp.ssm_v_heads = 1, hp.ssm_head_v = hp.n_embd;
    }

    const char* output_norm_name() const override { return "token_embd_norm.weight"; }
    // The short convolution layers work in BlockBuffers::recurrent: in_proj's rows, then the gated input
    // and the convolution's output.
    int64_t recurrent_scratch_floats(const HParams& hp) const override { return 5 * (int64_t)hp.n_embd; }

    // The attention layers' tensors (layer_tensors gives each layer its own kind's).
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override { return layer_specs(hp, false, false); }
    std::vector<TensorSpec> layer_tensors(const HParams& hp, int32_t l) const override {
        return layer_specs(hp, hp.recurrent_layer[l], moe_ && l >= hp.n_layer_dense_lead);
    }

    const float* forward_block(const BlockRun& r) const override {
        if (r.state) {
            r.be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), r.n_tok, r.hp.n_embd, r.hp.rms_eps, r.buf.xn);
            short_conv_mixer(r, r.out_a);
        } else {
            r.be.attn_in(attn_in_weights(r), r.x, r.residual, r.n_tok, r.kv, r.buf);
            r.be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), r.n_tok, r.buf, r.out_a);
        }
        if (!r.w.m(Role::router)->data) {
            r.be.ffn(ffn_weights(r, Activation::SiLU), r.x, r.out_a, r.n_tok, r.buf, r.out_b);
            return r.out_b;
        }
        const BlockWeights& w = r.experts ? r.experts->w : r.w;
        MoeWeights m = moe_weights(w, r.hp, MoeConfig{MoeGating::sigmoid, Activation::SiLU});
        m.norm = w.v(Role::ffn_norm);
        m.eps = r.hp.rms_eps;
        m.selection_bias = w.v(Role::exp_probs_b);
        m.norm_topk = true;   // llama.cpp's lfm2moe always renormalizes the chosen weights
        if (r.experts) moe_ffn_remote(r, m, r.out_a, r.out_b);
        else r.be.moe_ffn(m, r.x, r.out_a, r.n_tok, r.buf, r.out_b);
        return r.out_b;
    }

private:
    bool moe_;

    static std::vector<TensorSpec> layer_specs(const HParams& hp, bool conv, bool experts) {
        const int64_t E = hp.n_embd, F = hp.n_ff, D = hp.head_dim;
        std::vector<TensorSpec> t = {{Role::attn_norm, "attn_norm.weight", {E}},
                                     {Role::ffn_norm, "ffn_norm.weight", {E}}};
        if (experts) {
            for (TensorSpec& s : moe_block_tensors(hp, /*biases=*/false)) t.push_back(std::move(s));
            t.push_back({Role::exp_probs_b, "exp_probs_b.bias", {(int64_t)hp.n_expert}});
        } else {
            t.push_back({Role::gate, "ffn_gate.weight", {E, F}});
            t.push_back({Role::up, "ffn_up.weight", {E, F}});
            t.push_back({Role::down, "ffn_down.weight", {F, E}});
        }
        if (conv) {
            TensorSpec w{Role::ssm_conv, "shortconv.conv.weight", {hp.ssm_conv_kernel, E}};
            w.vector = true;
            t.push_back(w);
            t.push_back({Role::ssm_in, "shortconv.in_proj.weight", {E, 3 * E}});
            t.push_back({Role::ssm_out, "shortconv.out_proj.weight", {E, E}});
            return t;
        }
        const int64_t QW = (int64_t)hp.n_head * D, KW = (int64_t)hp.n_head_kv * D;
        for (TensorSpec s : std::vector<TensorSpec>{{Role::wq, "attn_q.weight", {E, QW}},
                                                    {Role::wk, "attn_k.weight", {E, KW}},
                                                    {Role::wv, "attn_v.weight", {E, KW}},
                                                    {Role::wo, "attn_output.weight", {QW, E}},
                                                    {Role::q_norm, "attn_q_norm.weight", {D}},
                                                    {Role::k_norm, "attn_k_norm.weight", {D}}})
            t.push_back(s);
        return t;
    }

    // out = out_proj(C * conv(B * x)), B, C and x the three parts of in_proj(xn), the convolution
    // carrying each sequence's last inputs in its slot; the activations in r.buf.recurrent.
    static void short_conv_mixer(const BlockRun& r, float* out) {
        const int32_t n = r.n_tok, E = r.hp.n_embd;
        if (!r.buf.recurrent) fail(r.hp.arch, ": its convolution layers need BlockBuffers::recurrent");
        float* bcx = r.buf.recurrent;   // [n][3 E]
        float* bx = bcx + (int64_t)n * 3 * E;
        float* y = bx + (int64_t)n * E;
        r.be.matmul(*r.w.m(Role::ssm_in), r.buf.xn, n, bcx);
        r.be.copy_rows(bx, E, bcx, 3 * E, E, n);
        r.be.copy_rows(y, E, bcx + 2 * E, 3 * E, E, n);
        r.be.mul(bx, y, (int64_t)n * E);
        const BatchInfo& b = *r.batch;
        // Each run of one sequence's tokens, in order, through its slot.
        for (int32_t t0 = 0; t0 < n;) {
            int32_t t1 = t0 + 1;
            while (t1 < n && b.seq[t1] == b.seq[t0]) ++t1;
            r.be.short_conv(bx + (int64_t)t0 * E, r.w.v(Role::ssm_conv), nullptr, t1 - t0, E, r.hp.ssm_conv_kernel,
                            false, r.state->conv_of(b.state_slot[b.seq[t0]]), y + (int64_t)t0 * E);
            t0 = t1;
        }
        // C into bx, whose gated input the convolution has read.
        r.be.copy_rows(bx, E, bcx + E, 3 * E, E, n);
        r.be.mul(y, bx, (int64_t)n * E);
        r.be.matmul(*r.w.m(Role::ssm_out), y, n, out);
    }
};

}  // namespace

const Architecture& lfm2_architecture() {
    static const Lfm2Arch arch(/*moe=*/false);
    return arch;
}

const Architecture& lfm2moe_architecture() {
    static const Lfm2Arch arch(/*moe=*/true);
    return arch;
}

}  // namespace ember
