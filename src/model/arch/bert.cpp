// The BERT family of encoders as llama.cpp's GGUFs hold them: "bert" (BERT, MiniLM, bge,
// snowflake-arctic-embed, RoBERTa / XLM-RoBERTa rerankers: absolute positions, token types, GELU
// feed-forward with biases) and "nomic-bert" (rotary positions, SwiGLU feed-forward, no biases).
// Both are post-norm with LayerNorms; pooling and the classifier head are Encoder's.
#include "ember/status.h"
#include "model/arch/encoder_arch.h"

namespace ember {

std::vector<TensorSpec> bert_block_tensors(const HParams& hp, bool gated) {
    const int64_t E = hp.n_embd, F = hp.n_ff, D = hp.head_dim;
    const int64_t QW = (int64_t)hp.n_head * D, KW = (int64_t)hp.n_head_kv * D;
    std::vector<TensorSpec> t;
    if (hp.qkv_fused) {
        const int64_t of = QW + 2 * KW;
        t.push_back({Role::wq, "attn_qkv.weight", {E, QW}, false, false, {0, of}});
        t.push_back({Role::wk, "attn_qkv.weight", {E, KW}, false, false, {QW, of}});
        t.push_back({Role::wv, "attn_qkv.weight", {E, KW}, false, false, {QW + KW, of}});
        // Its bias fused alike (llama.cpp's nomic-bert-moe), or separate attn_q/k/v biases (below).
        t.push_back({Role::bq, "attn_qkv.bias", {QW}, true, false, {0, of}});
        t.push_back({Role::bk, "attn_qkv.bias", {KW}, true, false, {QW, of}});
        t.push_back({Role::bv, "attn_qkv.bias", {KW}, true, false, {QW + KW, of}});
    } else {
        t.push_back({Role::wq, "attn_q.weight", {E, QW}});
        t.push_back({Role::wk, "attn_k.weight", {E, KW}});
        t.push_back({Role::wv, "attn_v.weight", {E, KW}});
    }
    std::vector<TensorSpec> rest = {
        {Role::bq, "attn_q.bias", {QW}, true},
        {Role::bk, "attn_k.bias", {KW}, true},
        {Role::bv, "attn_v.bias", {KW}, true},
        {Role::wo, "attn_output.weight", {QW, E}},
        {Role::bo, "attn_output.bias", {E}, true},
        {Role::post_attn_norm, "attn_output_norm.weight", {E}},
        {Role::post_attn_norm_b, "attn_output_norm.bias", {E}},
        {Role::up, "ffn_up.weight", {E, F}},
        {Role::up_b, "ffn_up.bias", {F}, true},
        {Role::down, "ffn_down.weight", {F, E}},
        {Role::down_b, "ffn_down.bias", {E}, true},
        {Role::post_ffn_norm, "layer_output_norm.weight", {E}},
        {Role::post_ffn_norm_b, "layer_output_norm.bias", {E}},
    };
    t.insert(t.end(), rest.begin(), rest.end());
    if (gated) t.push_back({Role::gate, "ffn_gate.weight", {E, F}});
    return t;
}

void read_encoder_hparams(const GGUFFile& f, HParams& hp, bool experts) {
    const std::string a = hp.arch + ".";
    if (f.get_bool(a + "attention.causal", false))
        fail(f.path(), ": ", a, "attention.causal is true; ", hp.arch, " is an encoder (bidirectional attention)");
    hp.rms_eps = (float)f.get_float(a + "attention.layer_norm_epsilon", 1e-12);
    if (hp.n_expert > 0 && !experts)
        fail(f.path(), ": ", hp.arch, " with experts (", a, "expert_count) is not supported");
    hp.qkv_fused = f.find_tensor("blk.0.attn_qkv.weight") != nullptr;
    if (f.find_tensor("blk.0.attn_qkv.bias") && (!hp.qkv_fused || f.find_tensor("blk.0.attn_q.bias")))
        fail(f.path(), ": attn_qkv.bias needs attn_qkv.weight and no separate attn_q/k/v biases beside it");
}

namespace {

class BertArch final : public EncoderArch {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override { read_encoder_hparams(f, hp, false); }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override { return bert_block_tensors(hp, false); }
    bool absolute_positions() const override { return true; }
    bool input_layernorm() const override { return true; }
    const float* forward_block(const BlockRun& r) const override { return post_norm_encoder_block(r, false, false); }
};

class NomicBertArch final : public EncoderArch {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        read_encoder_hparams(f, hp, false);
        hp.rope_neox = true;   // nomic's rotary halves (rotary_emb_interleaved false)
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override { return bert_block_tensors(hp, true); }
    bool input_layernorm() const override { return true; }
    const float* forward_block(const BlockRun& r) const override { return post_norm_encoder_block(r, true, true); }
};

}  // namespace

void post_norm_encoder_attention(const BlockRun& r, bool rotary) {
    Backend& be = r.be;
    const int32_t n = r.n_tok, E = r.hp.n_embd;
    const BlockBuffers& b = r.buf;
    if (r.residual) be.add(r.x, r.residual, (int64_t)n * E);
    const Weight* ws[3] = {r.w.m(Role::wq), r.w.m(Role::wk), r.w.m(Role::wv)};
    float* ys[3] = {b.q, b.k, b.v};
    be.matmul_many(ws, ys, 3, r.x, n);
    const AttentionShape& shape = r.cfg.shape;
    const int32_t qw = shape.n_head * shape.head_dim, kw = shape.n_head_kv * shape.head_dim;
    if (r.w.v(Role::bq)) be.add_bias(b.q, r.w.v(Role::bq), n, qw);
    if (r.w.v(Role::bk)) be.add_bias(b.k, r.w.v(Role::bk), n, kw);
    if (r.w.v(Role::bv)) be.add_bias(b.v, r.w.v(Role::bv), n, kw);
    if (rotary) {
        be.rope(b.q, n, shape.n_head, r.cfg.rope);
        be.rope(b.k, n, shape.n_head_kv, r.cfg.rope);
    }
    be.encoder_attention(b.q, b.k, b.v, n, shape, b.att);
    be.matmul(*r.w.m(Role::wo), b.att, n, r.out_a);
    if (r.w.v(Role::bo)) be.add_bias(r.out_a, r.w.v(Role::bo), n, E);
    be.add(r.out_a, r.x, (int64_t)n * E);
    be.layernorm(r.out_a, r.w.v(Role::post_attn_norm), r.w.v(Role::post_attn_norm_b), n, E, r.hp.rms_eps, r.x);
}

void post_norm_encoder_ffn_end(const BlockRun& r) {
    const int32_t n = r.n_tok, E = r.hp.n_embd;
    if (r.w.v(Role::down_b)) r.be.add_bias(r.out_a, r.w.v(Role::down_b), n, E);
    r.be.add(r.out_a, r.x, (int64_t)n * E);
    r.be.layernorm(r.out_a, r.w.v(Role::post_ffn_norm), r.w.v(Role::post_ffn_norm_b), n, E, r.hp.rms_eps, r.x);
}

const float* post_norm_encoder_block(const BlockRun& r, bool rotary, bool gated) {
    Backend& be = r.be;
    const int32_t n = r.n_tok;
    const int64_t F = r.w.m(Role::up)->n_out;
    const BlockBuffers& b = r.buf;
    post_norm_encoder_attention(r, rotary);
    if (gated) {
        const Weight* fw[2] = {r.w.m(Role::gate), r.w.m(Role::up)};
        float* fy[2] = {b.gate, b.up};
        be.matmul_many(fw, fy, 2, r.x, n);
        be.gated_act(Activation::SiLU, b.gate, b.up, (int64_t)n * F, b.gate);
    } else {
        be.matmul(*r.w.m(Role::up), r.x, n, b.gate);
        if (r.w.v(Role::up_b)) be.add_bias(b.gate, r.w.v(Role::up_b), n, (int32_t)F);
        be.unary(UnaryOp::GeLUErf, b.gate, (int64_t)n * F);
    }
    be.matmul(*r.w.m(Role::down), b.gate, n, r.out_a);
    post_norm_encoder_ffn_end(r);
    return nullptr;
}

const Architecture& bert_architecture() {
    static const BertArch arch;
    return arch;
}

const Architecture& nomic_bert_architecture() {
    static const NomicBertArch arch;
    return arch;
}

}  // namespace ember
