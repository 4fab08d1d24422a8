// Multi-head latent attention in its absorbed form (mla.h). A head's query is [q_nope | q_rope]; q_nope
// goes through the head's attn_k_b into the latent space, so every head attends over the one cached
// row [k_rope | latent] (MQA) and reads that row back as its value; the value's latent part then goes
// through the head's attn_v_b. Strided pieces move with the contract's copies.
#include "model/arch/mla.h"

#include "ember/status.h"

namespace ember {

namespace {

// y[i * y_stride + j] = x[i * x_stride + j] for i < rows, j < width (floats in the backend's memory).
void copy_rows(Backend& be, float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width) {
    if (x_stride == width && y_stride == width) {
        be.copy(y, x, (size_t)(rows * width) * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < rows; ++i) be.copy(y + i * y_stride, x + i * x_stride, (size_t)width * sizeof(float));
}

}  // namespace

std::vector<TensorSpec> mla_tensors(const HParams& hp) {
    const int64_t E = hp.n_embd, H = hp.n_head, R = hp.n_rot, L = hp.kv_lora_rank, K = hp.mla_head_dim_k;
    const int64_t N = K - R, V = hp.mla_head_dim_v;
    std::vector<TensorSpec> t = {
        {Role::attn_norm, "attn_norm.weight", {E}},          {Role::mla_kv_a, "attn_kv_a_mqa.weight", {E, L + R}},
        {Role::mla_kv_a_norm, "attn_kv_a_norm.weight", {L}}, {Role::mla_k_b, "attn_k_b.weight", {N, L, H}},
        {Role::mla_v_b, "attn_v_b.weight", {L, V, H}},       {Role::wo, "attn_output.weight", {H * V, E}},
    };
    if (hp.q_lora_rank > 0) {
        t.push_back({Role::mla_q_a, "attn_q_a.weight", {E, hp.q_lora_rank}});
        t.push_back({Role::mla_q_a_norm, "attn_q_a_norm.weight", {hp.q_lora_rank}});
        t.push_back({Role::mla_q_b, "attn_q_b.weight", {hp.q_lora_rank, H * K}});
    } else {
        t.push_back({Role::wq, "attn_q.weight", {E, H * K}});
    }
    return t;
}

void check_mla_hparams(const GGUFFile& f, const HParams& hp) {
    const std::string a = hp.arch + ".attention.";
    const int64_t R = hp.n_rot, L = hp.kv_lora_rank, K = hp.mla_head_dim_k, V = hp.mla_head_dim_v;
    if (L <= 0) fail(f.path(), ": ", a, "kv_lora_rank must be positive, got ", L);
    if (K <= R || V <= 0)
        fail(f.path(), ": ", a, "key_length_mla ", K, " must exceed rope.dimension_count ", R, " and value_length_mla ",
             V, " must be positive");
    if (hp.head_dim != L + R)
        fail(f.path(), ": ", a, "key_length ", hp.head_dim, " must be kv_lora_rank + rope.dimension_count (", L + R,
             "): the cached row of latent attention");
    const int64_t v_len = (int64_t)f.get_uint(a + "value_length", (uint64_t)L);
    if (v_len != L) fail(f.path(), ": ", a, "value_length ", v_len, " must be kv_lora_rank ", L);
    if (hp.n_head_kv != 1 || !hp.n_head_kv_layer.empty())
        fail(f.path(), ": ", a, "head_count_kv must be 1 (the latent is one KV head), got ", hp.n_head_kv);
    // The forward works in the fused ops' buffers (BlockBuffers), sized by n_embd and the cached row.
    if (K - R > L || V > L + R || L > hp.n_embd || K - R > hp.n_embd || V > hp.n_embd ||
        hp.q_lora_rank > hp.n_head * (L + R))
        fail(f.path(), ": latent attention with key_length_mla ", K, ", value_length_mla ", V, ", kv_lora_rank ", L,
             " and q_lora_rank ", hp.q_lora_rank, " does not fit the block buffers of embedding_length ", hp.n_embd);
}

void mla_attention(const BlockRun& r, float* out) {
    Backend& be = r.be;
    const BlockBuffers& b = r.buf;
    const HParams& hp = r.hp;
    const int32_t n = r.n_tok, H = hp.n_head;
    const int64_t R = hp.n_rot, L = hp.kv_lora_rank, D = R + L, K = hp.mla_head_dim_k, N = K - R, V = hp.mla_head_dim_v;
    const float eps = hp.rms_eps;
    be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), n, hp.n_embd, eps, b.xn);
    // The queries [n][H][N | R] land in att; the latent and rotated key [n][L | R] in v.
    const bool q_lora = r.w.m(Role::mla_q_a)->data != nullptr;
    const Weight* ws[2] = {q_lora ? r.w.m(Role::mla_q_a) : r.w.m(Role::wq), r.w.m(Role::mla_kv_a)};
    float* ys[2] = {q_lora ? b.q : b.att, b.v};
    be.matmul_many(ws, ys, 2, b.xn, n);
    if (q_lora) {
        be.rmsnorm(b.q, r.w.v(Role::mla_q_a_norm), n, hp.q_lora_rank, eps, b.q);
        be.matmul(*r.w.m(Role::mla_q_b), b.q, n, b.att);
    }

    // The cached rows [n][R | L]: the shared key part, rotated, and the normed latent.
    copy_rows(be, b.k, D, b.v + L, D, n, R);
    copy_rows(be, b.xn, L, b.v, D, n, L);
    be.rmsnorm(b.xn, r.w.v(Role::mla_kv_a_norm), n, (int32_t)L, eps, b.xn);
    copy_rows(be, b.k + R, D, b.xn, L, n, L);
    be.rope(b.k, n, 1, r.cfg.rope);
    be.kv_store(r.kv, b.k, b.k, n);

    // Absorbed queries [n][H][R | L]: each head's rope part, and its nope part through its k_b.
    copy_rows(be, b.q, D, b.att + N, K, (int64_t)n * H, R);
    for (int32_t h = 0; h < H; ++h) {
        copy_rows(be, b.xn, N, b.att + h * K, H * K, n, N);
        be.matmul(expert_matrix(*r.w.m(Role::mla_k_b), h), b.xn, n, b.v);
        copy_rows(be, b.q + h * D + R, H * D, b.v, L, n, L);
    }
    be.rope(b.q, n, H, r.cfg.rope);

    // Each head's output [R | L] is a mix of cached rows; its latent part goes through the head's v_b.
    be.attention(r.kv, b.q, n, r.cfg.shape, b.att);
    for (int32_t h = 0; h < H; ++h) {
        copy_rows(be, b.v, L, b.att + h * D + R, H * D, n, L);
        be.matmul(expert_matrix(*r.w.m(Role::mla_v_b), h), b.v, n, b.xn);
        copy_rows(be, b.q + h * V, H * V, b.xn, V, n, V);
    }
    be.matmul(*r.w.m(Role::wo), b.q, n, out);
}

}  // namespace ember
