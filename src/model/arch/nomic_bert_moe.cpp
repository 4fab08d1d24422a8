// "nomic-bert-moe" (nomic-embed-text v2 MoE) as llama.cpp's GGUFs hold it: nomic-bert's rotary
// post-norm block with BERT's biases and GELU feed-forward, every moe_every_n_layers-th layer
// (l % n == 1) a mixture of non-gated GELU experts under a softmax router.
#include "ember/status.h"
#include "model/arch/encoder_arch.h"
#include "model/arch/moe_common.h"

namespace ember {

namespace {

bool has(const GGUFFile& f, int32_t l, const char* name) {
    return f.find_tensor("blk." + std::to_string(l) + "." + name) != nullptr;
}

// The experts: y = sum over the token's chosen e of weight_e * down_e(GELU(up_e x)), into out_a.
// Composed of the contract's routing and row primitives: Backend::moe's experts are gated.
void nomic_experts(const BlockRun& r) {
    Backend& be = r.be;
    const HParams& hp = r.hp;
    const int32_t n = r.n_tok;
    const int64_t E = hp.n_embd, X = hp.n_expert, rows = (int64_t)n * hp.n_expert_used;
    MoeWeights m;
    m.router = r.w.m(Role::router);
    m.up = r.w.m(Role::up_exps), m.down = r.w.m(Role::down_exps);
    m.n_expert = hp.n_expert, m.n_used = hp.n_expert_used;
    m.gating = MoeGating::softmax;
    m.norm_topk = false;   // the chosen experts keep their softmax weights over all experts
    m.weight_scale = hp.expert_weights_scale;
    const int64_t F = m.up->n_out;

    float* logits = r.buf.moe;
    auto* ids = reinterpret_cast<int32_t*>(logits + n * X);
    float* weights = logits + n * X + rows;
    auto* grp_rows = reinterpret_cast<int32_t*>(weights + rows);
    float* grp_w = weights + 2 * rows;
    float* xg = aligned_scratch(weights + 3 * rows);
    float* h = xg + rows * E;

    be.matmul(*m.router, r.x, n, logits);
    be.moe_route(m, logits, n, ids, weights);
    std::vector<int32_t> ids_h(rows);
    std::vector<float> w_h(rows);
    be.copy_to_host(ids_h.data(), ids, rows * sizeof(int32_t));
    be.copy_to_host(w_h.data(), weights, rows * sizeof(float));
    const MoeGroups g = moe_groups(ids_h.data(), w_h.data(), n, m.n_used, m.n_expert);
    be.copy_from_host(grp_rows, g.tok.data(), rows * sizeof(int32_t));
    be.copy_from_host(grp_w, g.weight.data(), rows * sizeof(float));
    const std::vector<float> zeros((size_t)n * E, 0.0f);
    be.copy_from_host(r.out_a, zeros.data(), zeros.size() * sizeof(float));
    for (int32_t e = 0; e < m.n_expert; ++e) {
        const int64_t at = g.first[e];
        const int32_t c = int32_t(g.first[e + 1] - at);
        if (c == 0) continue;
        float* x_e = xg + at * E;
        float* h_e = h + at * F;
        be.gather_rows(r.x, grp_rows + at, c, E, x_e);
        be.matmul(expert_matrix(*m.up, e), x_e, c, h_e);
        be.unary(UnaryOp::GeLUErf, h_e, (int64_t)c * F);
        // The expert's input rows are spent: its output takes their place.
        be.matmul(expert_matrix(*m.down, e), h_e, c, x_e);
        be.scatter_add_rows(r.out_a, x_e, grp_rows + at, grp_w + at, c, E);
    }
}

class NomicBertMoeArch final : public EncoderArch {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        read_encoder_hparams(f, hp, true);
        hp.rope_neox = true;
        const std::string a = hp.arch + ".";
        const int64_t every = (int64_t)f.get_uint(a + "moe_every_n_layers", 0);
        if (every < 0 || every > hp.n_layer) fail(f.path(), ": ", a, "moe_every_n_layers ", every, " is out of range");
        if (every > 0 && hp.n_expert == 0)
            fail(f.path(), ": ", hp.arch, " with ", a, "moe_every_n_layers needs ", a, "expert_count and ", a,
                 "expert_used_count");
        // llama.cpp's rule, which layers hold experts, checked against the tensors the file has.
        for (int32_t l = 0; l < hp.n_layer; ++l) {
            const bool moe = every > 0 && l % every == 1;
            for (const char* name : {"ffn_gate_inp.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"})
                if (has(f, l, name) != moe)
                    fail(f.path(), ": blk.", l, (moe ? " needs " : " must not have "), name, " (", a,
                         "moe_every_n_layers is ", every, ")");
            for (const char* name : {"ffn_up.weight", "ffn_down.weight"})
                if (has(f, l, name) == moe)
                    fail(f.path(), ": blk.", l, (moe ? " must not have " : " needs "), name, " (", a,
                         "moe_every_n_layers is ", every, ")");
        }
    }
    // The dense and the mixture feed-forward's tensors are both optional here: read_hparams has
    // checked each layer holds the one llama.cpp's rule gives it.
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        std::vector<TensorSpec> t = bert_block_tensors(hp, false);
        for (TensorSpec& s : t)
            if (s.role == Role::up || s.role == Role::down) s.optional = true;
        if (hp.n_expert == 0) return t;
        const int64_t E = hp.n_embd, F = hp.n_ff_exp, X = hp.n_expert;
        t.push_back({Role::router, "ffn_gate_inp.weight", {E, X}, true});
        t.push_back({Role::up_exps, "ffn_up_exps.weight", {E, F, X}, true});
        t.push_back({Role::down_exps, "ffn_down_exps.weight", {F, E, X}, true});
        return t;
    }
    bool input_layernorm() const override { return true; }
    const float* forward_block(const BlockRun& r) const override {
        if (!r.w.m(Role::router)->data) return post_norm_encoder_block(r, true, false);
        post_norm_encoder_attention(r, true);
        nomic_experts(r);
        post_norm_encoder_ffn_end(r);
        return nullptr;
    }
};

}  // namespace

const Architecture& nomic_bert_moe_architecture() {
    static const NomicBertMoeArch arch;
    return arch;
}

}  // namespace ember
