// EmbeddingGemma ("gemma-embedding"): Gemma 3's blocks (embeddings scaled by sqrt(n_embd), q/k
// RMSNorms, norms before and after attention and the feed-forward, GeLU(tanh)-gated feed-forward,
// local layers with their own rope base) attending bidirectionally; a local layer sees the tokens
// within half its sliding window on either side, as llama.cpp's symmetric window. Norm weights are
// stored as 1 + w (llama.cpp's convention). The output RMSNorm, pooling and the dense layers are
// Encoder's.
#include <cmath>

#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/encoder_arch.h"

namespace ember {

namespace {

class GemmaEmbeddingArch final : public EncoderArch {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        const std::string a = hp.arch + ".";
        hp.rope_neox = true;
        if (hp.n_expert > 0) fail(f.path(), ": ", hp.arch, " has no experts (", a, "expert_count)");
        hp.attn_scale = (float)f.get_float(a + "attention.scale", 0.0);
        hp.n_swa = (int32_t)f.get_uint(a + "attention.sliding_window", 0);
        hp.rope_base_swa = (float)f.get_float(a + "rope.freq_base_swa", 10000.0);
        hp.swa_layer.assign(hp.n_layer, false);
        if (hp.n_swa <= 0) return;
        const GGUFValue* pat = f.find(a + "attention.sliding_window_pattern");
        if (pat && pat->type == GGUFType::ARRAY) {
            if ((int64_t)pat->arr.size() != hp.n_layer || pat->elem_type != GGUFType::BOOL)
                fail(f.path(), ": ", a, "attention.sliding_window_pattern must be a period or ", hp.n_layer,
                     " bools, got an array of ", pat->arr.size());
            for (int32_t l = 0; l < hp.n_layer; ++l) hp.swa_layer[l] = pat->arr[l].num.b;
            return;
        }
        const int64_t period = (int64_t)f.get_uint(a + "attention.sliding_window_pattern", 6);
        if (period <= 0) fail(f.path(), ": ", a, "attention.sliding_window_pattern must be positive, got ", period);
        for (int32_t l = 0; l < hp.n_layer; ++l) hp.swa_layer[l] = l % period < period - 1;
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        std::vector<TensorSpec> t = llama_block_tensors(hp, /*biases=*/false, /*qk_norm=*/true);
        t.push_back({Role::post_attn_norm, "post_attention_norm.weight", {hp.n_embd}});
        t.push_back({Role::post_ffn_norm, "post_ffw_norm.weight", {hp.n_embd}});
        return t;
    }
    float embd_scale(const HParams& hp) const override { return std::sqrt((float)hp.n_embd); }
    bool output_rmsnorm() const override { return true; }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        if (hp.attn_scale > 0.0f) c.shape.scale = hp.attn_scale;
        if (hp.swa_layer[l]) {
            // |pos[i] - pos[j]| <= n_swa / 2, as the op's window (a strict bound) says it.
            c.shape.window = hp.n_swa / 2 + 1;
            c.rope = RopeParams{};
            c.rope.base = hp.rope_base_swa;
            c.rope.head_dim = rope.head_dim;
            c.rope.neox = rope.neox;
        }
        return c;
    }
    const float* forward_block(const BlockRun& r) const override {
        Backend& be = r.be;
        const int32_t n = r.n_tok, E = r.hp.n_embd;
        const float eps = r.hp.rms_eps;
        const BlockBuffers& b = r.buf;
        const AttentionShape& shape = r.cfg.shape;
        be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), n, E, eps, b.xn);
        const Weight* ws[3] = {r.w.m(Role::wq), r.w.m(Role::wk), r.w.m(Role::wv)};
        float* ys[3] = {b.q, b.k, b.v};
        be.matmul_many(ws, ys, 3, b.xn, n);
        be.head_rmsnorm(b.q, r.w.v(Role::q_norm), n, shape.n_head, shape.head_dim, eps);
        be.head_rmsnorm(b.k, r.w.v(Role::k_norm), n, shape.n_head_kv, shape.head_dim, eps);
        be.rope(b.q, n, shape.n_head, r.cfg.rope);
        be.rope(b.k, n, shape.n_head_kv, r.cfg.rope);
        be.encoder_attention(b.q, b.k, b.v, n, shape, b.att);
        be.matmul(*r.w.m(Role::wo), b.att, n, r.out_a);
        be.rmsnorm(r.out_a, r.w.v(Role::post_attn_norm), n, E, eps, r.out_b);
        be.ffn(ffn_weights(r, Activation::GeLUTanh), r.x, r.out_b, n, b, r.out_a);
        be.rmsnorm(r.out_a, r.w.v(Role::post_ffn_norm), n, E, eps, r.out_b);
        return r.out_b;
    }
};

}  // namespace

const Architecture& gemma_embedding_architecture() {
    static const GemmaEmbeddingArch arch;
    return arch;
}

}  // namespace ember
