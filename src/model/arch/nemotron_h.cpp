// Nemotron-H (NVIDIA Nemotron-H, Nemotron 3 dense): each layer one mixer after an RMSNorm, added to
// the residual stream: a Mamba2 layer (state per sequence), an attention layer without rope, or a
// squared-ReLU MLP. The kinds as llama.cpp reads them from the per-layer head_count_kv and
// feed_forward_length: both 0 is Mamba2, a feed-forward width an MLP, else attention.
#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/mamba2_common.h"
#include "model/arch/moe_common.h"

namespace ember {

namespace {

class NemotronHArch : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        const std::string a = hp.arch + ".";
        check_experts(f, hp, false, false);
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
        const int64_t E = hp.n_embd, F = hp.layer_n_ff(l);
        return {{Role::attn_norm, "attn_norm.weight", {E}},
                {Role::up, "ffn_up.weight", {E, F}},
                {Role::down, "ffn_down.weight", {F, E}}};
    }

    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        c.use_rope = false;
        return c;
    }

    const float* forward_block(const BlockRun& r) const override {
        // The grouped norm and the squared ReLU are loops over host memory until the contract has them.
        if (!r.be.is_host()) fail(r.hp.arch, " runs on the CPU only so far (backend ", r.be.name(), ")");
        const int32_t n = r.n_tok;
        const bool mlp = r.w.m(Role::up)->n_out > 0;
        if (r.state) {
            r.be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), n, r.hp.n_embd, r.hp.rms_eps, r.buf.xn);
            mamba2_mixer(r, r.out_a);
        } else if (!mlp) {
            r.be.attn_in(attn_in_weights(r), r.x, r.residual, n, r.kv, r.buf);
            r.be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), n, r.buf, r.out_a);
        } else {
            r.be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), n, r.hp.n_embd, r.hp.rms_eps, r.buf.xn);
            const Weight& up = *r.w.m(Role::up);
            r.be.matmul(up, r.buf.xn, n, r.buf.up);
            float* h = r.buf.up;
            for (int64_t i = 0; i < (int64_t)n * up.n_out; ++i) h[i] = h[i] > 0.0f ? h[i] * h[i] : 0.0f;
            r.be.matmul(*r.w.m(Role::down), h, n, r.out_a);
        }
        return r.out_a;
    }

private:
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
    static const NemotronHArch arch;
    return arch;
}

}  // namespace ember
