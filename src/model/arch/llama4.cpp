// Llama 4 (the text model): pre-norm blocks, rope on adjacent pairs, chunked local attention on the
// rope layers and full attention without rope on every fourth (NoPE, with the attention temperature),
// q and k L2-normalized per head on the rope layers, and a feed-forward that is dense or a top-k
// sigmoid-routed mixture (weights on the experts' inputs) with a shared expert, as the file interleaves.
#include <string>

#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

class Llama4Arch final : public Architecture {
public:
    // llama.cpp's reading of a llama4 file: chunks of attention.sliding_window positions (8192 when
    // the key is absent; 0: no chunks and the NoPE period is the whole stack), three chunked rope
    // layers then one NoPE layer, a mixture every interleave_moe_layer_step-th layer.
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = false;
        check_experts(f, hp, /*allowed=*/true, /*required=*/true);
        const std::string a = "llama4.";
        const int64_t chunk = f.find(a + "attention.sliding_window")
                                  ? (int64_t)f.get_uint(a + "attention.sliding_window")
                                  : kDefaultChunk;
        hp.n_swa = (int32_t)chunk;
        if (chunk > 0) read_swa_pattern(f, "llama4", kNoRopePeriod, hp);
        else hp.swa_layer.assign(hp.n_layer, false);
        hp.attn_temp_scale = (float)f.get_float(a + "attention.temperature_scale", chunk > 0 ? 0.1 : 0.0);
        hp.attn_temp_length = (int32_t)f.get_uint(a + "attention.temperature_length", kDefaultChunk);
        if (hp.attn_temp_scale != 0.0f && hp.attn_temp_length <= 0)
            fail(f.path(), ": ", a, "attention.temperature_length must be positive, got ", hp.attn_temp_length);
        const int64_t step = (int64_t)f.get_uint(a + "interleave_moe_layer_step");
        if (step <= 0) fail(f.path(), ": ", a, "interleave_moe_layer_step must be positive, got ", step);
        for (int32_t l = 0; l < hp.n_layer; ++l) {
            const bool moe = (l + 1) % step == 0;
            const std::string router = "blk." + std::to_string(l) + ".ffn_gate_inp.weight";
            if (moe != (f.find_tensor(router) != nullptr))
                fail(f.path(), ": layer ", l, (moe ? " must have" : " must not have"), " a mixture (", router,
                     ") with ", a, "interleave_moe_layer_step ", step);
        }
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override {
        const int64_t E = hp.n_embd, F = hp.n_ff, FX = hp.n_ff_exp;
        const int64_t QW = (int64_t)hp.n_head * hp.head_dim, KW = (int64_t)hp.n_head_kv * hp.head_dim;
        std::vector<TensorSpec> t = {
            {Role::attn_norm, "attn_norm.weight", {E}}, {Role::wq, "attn_q.weight", {E, QW}},
            {Role::wk, "attn_k.weight", {E, KW}},       {Role::wv, "attn_v.weight", {E, KW}},
            {Role::wo, "attn_output.weight", {QW, E}},  {Role::ffn_norm, "ffn_norm.weight", {E}},
        };
        // A layer is dense or a mixture (read_hparams checked which): both sets are optional here.
        std::vector<TensorSpec> ffn = {
            {Role::gate, "ffn_gate.weight", {E, F}},          {Role::up, "ffn_up.weight", {E, F}},
            {Role::down, "ffn_down.weight", {F, E}},          {Role::gate_shexp, "ffn_gate_shexp.weight", {E, FX}},
            {Role::up_shexp, "ffn_up_shexp.weight", {E, FX}}, {Role::down_shexp, "ffn_down_shexp.weight", {FX, E}},
        };
        for (TensorSpec& s : moe_block_tensors(hp, /*biases=*/false)) ffn.push_back(std::move(s));
        for (TensorSpec& s : ffn) {
            s.optional = true;
            t.push_back(std::move(s));
        }
        return t;
    }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        const int32_t no_rope_period = hp.n_swa > 0 ? kNoRopePeriod : hp.n_layer;
        c.use_rope = (l + 1) % no_rope_period != 0;
        if (hp.swa_layer[l]) c.shape.chunk = hp.n_swa;
        // The temperature scales the queries of the NoPE layers only, counting positions from 1.
        c.rope.temp_scale = c.use_rope ? 0.0f : hp.attn_temp_scale;
        c.rope.temp_length = hp.attn_temp_length;
        c.rope.temp_offset = 1;
        return c;
    }
    const float* forward_block(const BlockRun& r) const override {
        const int32_t n = r.n_tok;
        const BlockBuffers& b = r.buf;
        if (r.cfg.use_rope && qk_norm(r.hp)) {
            // Rope, then each head of q and k normalized without weights (as transformers orders them).
            const AttnInWeights a = attn_in_weights(r);
            r.be.add_rmsnorm(r.x, r.residual, a.norm, n, r.hp.n_embd, a.eps, b.xn);
            const Weight* ws[3] = {a.wq, a.wk, a.wv};
            float* ys[3] = {b.q, b.k, b.v};
            r.be.matmul_many(ws, ys, 3, b.xn, n);
            r.be.rope(b.q, n, a.n_head, r.cfg.rope);
            r.be.rope(b.k, n, a.n_head_kv, r.cfg.rope);
            r.be.head_rmsnorm(b.q, nullptr, n, a.n_head, a.head_dim, a.eps);
            r.be.head_rmsnorm(b.k, nullptr, n, a.n_head_kv, a.head_dim, a.eps);
            r.be.kv_store(r.kv, b.k, b.v, n);
        } else {
            r.be.attn_in(attn_in_weights(r), r.x, r.residual, n, r.kv, b);
            if (!r.cfg.use_rope && r.cfg.rope.temp_scale != 0.0f)
                r.be.attn_temperature(b.q, n, (int64_t)r.hp.n_head * r.hp.head_dim, r.cfg.rope);
        }
        r.be.attn_out(r.kv, r.cfg.shape, *r.w.m(Role::wo), n, b, r.out_a);
        if (r.w.m(Role::gate)->data) r.be.ffn(ffn_weights(r, Activation::SiLU), r.x, r.out_a, n, b, r.out_b);
        else run_moe_ffn(r, MoeConfig{MoeGating::sigmoid, Activation::SiLU, /*weight_input=*/true}, r.out_a, r.out_b);
        return r.out_b;
    }

private:
    static constexpr int64_t kDefaultChunk = 8192;
    static constexpr int32_t kNoRopePeriod = 4;
    // llama.cpp's rule (its files carry no key for it): every llama 4 but the 128-expert one
    // normalizes q and k.
    static bool qk_norm(const HParams& hp) { return hp.n_expert != 128; }
};

const Architecture& llama4_architecture() {
    static const Llama4Arch arch;
    return arch;
}

}  // namespace ember
