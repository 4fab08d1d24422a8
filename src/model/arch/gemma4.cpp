// Gemma 4 (dense): Gemma 3's sandwich-normed block with sliding-window and global layers of their
// own head size and KV heads, RMS-normed values (no scale), KV shared by the last layers (each reads
// the last earlier layer of its kind), per-layer embeddings, a per-layer factor on the hidden state,
// unscaled attention and soft-capped logits. GGUF conventions are llama.cpp's (plain norm weights,
// the global layers' proportional rope as rope_freqs.weight). The mixture (26B-A4B) adds to each
// layer's dense MLP a mixture of GeGLU experts beside it, each with norms of its own.
#include <cmath>
#include <vector>

#include "ember/status.h"
#include "model/arch/arch_common.h"
#include "model/arch/moe_common.h"

namespace ember {

namespace {

// Layer l's factor on the hidden state (blk.l.layer_output_scale.weight, one f32); 1 when absent.
float layer_scale(const GGUFFile& f, int32_t l) {
    const std::string name = "blk." + std::to_string(l) + ".layer_output_scale.weight";
    const GGUFTensor* t = f.find_tensor(name);
    if (!t) return 1.0f;
    if (t->type != GGMLType::F32 || t->n_elements() != 1) fail(f.path(), ": tensor '", name, "' must be one F32 value");
    const float s = *reinterpret_cast<const float*>(t->data);
    if (!std::isfinite(s)) fail(f.path(), ": tensor '", name, "' is ", s, ", must be finite");
    return s;
}

// The experts' part of a mixture layer: out = experts(rmsnorm(x) * pre_ffw_norm_2), routed by
// softmax over router(rmsnorm(x) * router_scale / sqrt(n_embd)), the chosen weights renormalized and
// multiplied by each expert's output scale. Composed from the contract's primitives because its moe
// op feeds the router the experts' own normed rows and has no per-expert scale. The experts' gate
// and up are one fused matrix per expert (gate rows first), split by gathering each output row's halves,
// or two matrices (ffn_gate_exps and ffn_up_exps), as llama.cpp reads either.
void gemma4_experts(const BlockRun& r, float* router_in, float* out) {   // router_in may be out
    Backend& be = r.be;
    const HParams& hp = r.hp;
    const BlockBuffers& b = r.buf;
    const int32_t n = r.n_tok, X = hp.n_expert, U = hp.n_expert_used;
    const int64_t E = hp.n_embd, F = hp.n_ff_exp, rows = (int64_t)n * U;
    MoeWeights m;
    m.router = r.w.m(Role::router);
    m.n_expert = X, m.n_used = U;
    m.gating = MoeGating::softmax;
    m.norm_topk = true;

    float* logits = b.moe;
    auto* ids = reinterpret_cast<int32_t*>(logits + (int64_t)n * X);
    float* weights = logits + (int64_t)n * X + rows;
    auto* grp_rows = reinterpret_cast<int32_t*>(weights + rows);
    float* grp_w = weights + 2 * rows;
    auto* halves = reinterpret_cast<int32_t*>(weights + 3 * rows);   // [n] even rows, then [n] odd
    float* xg = aligned_scratch(weights + 3 * rows + 2 * n);
    float* gate_up = xg + rows * E;
    float* gate = gate_up + 2 * (int64_t)n * F;
    float* up = gate + (int64_t)n * F;
    if (up + (int64_t)n * F > b.moe + moe_scratch_floats(n, E, F, X, U))
        fail("gemma4: the experts' scratch exceeds moe_scratch_floats");

    be.rmsnorm(r.x, r.w.v(Role::router_scale), n, (int32_t)E, hp.rms_eps, router_in);
    be.scale_softcap(router_in, n * E, 1.0f / std::sqrt((float)E), 0.0f);
    be.matmul(*m.router, router_in, n, logits);
    be.moe_route(m, logits, n, ids, weights);
    be.rmsnorm(r.x, r.w.v(Role::ffn_norm_2), n, (int32_t)E, hp.rms_eps, b.xn);

    std::vector<int32_t> ids_h(rows);
    std::vector<float> w_h(rows);
    be.copy_to_host(ids_h.data(), ids, rows * sizeof(int32_t));
    be.copy_to_host(w_h.data(), weights, rows * sizeof(float));
    MoeGroups g = moe_groups(ids_h.data(), w_h.data(), n, U, X);
    if (const float* s = r.w.v(Role::down_exps_scale)) {
        std::vector<float> scale(X);
        be.copy_to_host(scale.data(), s, X * sizeof(float));
        for (int32_t e = 0; e < X; ++e)
            for (int64_t i = g.first[e]; i < g.first[e + 1]; ++i) g.weight[i] *= scale[e];
    }
    be.copy_from_host(grp_rows, g.tok.data(), rows * sizeof(int32_t));
    be.copy_from_host(grp_w, g.weight.data(), rows * sizeof(float));
    std::vector<int32_t> halves_h(2 * (size_t)n);
    for (int32_t i = 0; i < n; ++i) halves_h[i] = 2 * i, halves_h[n + i] = 2 * i + 1;
    be.copy_from_host(halves, halves_h.data(), halves_h.size() * sizeof(int32_t));
    const std::vector<float> zeros(n * E, 0.0f);
    be.copy_from_host(out, zeros.data(), zeros.size() * sizeof(float));

    const Weight &gu = *r.w.m(Role::gate_exps), &down = *r.w.m(Role::down_exps);
    const Weight* up_w = r.w.m(Role::up_exps)->data ? r.w.m(Role::up_exps) : nullptr;   // null: gu is fused
    for (int32_t e = 0; e < X; ++e) {
        const int64_t at = g.first[e];
        const int32_t c = (int32_t)(g.first[e + 1] - at);
        if (c == 0) continue;
        float* x_e = xg + at * E;
        be.gather_rows(b.xn, grp_rows + at, c, E, x_e);
        if (up_w) {
            be.matmul(expert_matrix(gu, e), x_e, c, gate);
            be.matmul(expert_matrix(*up_w, e), x_e, c, up);
        } else {
            be.matmul(expert_matrix(gu, e), x_e, c, gate_up);
            // Row t of gate_up is rows 2t (gate) and 2t + 1 (up) of it read as [2c][F].
            be.gather_rows(gate_up, halves, c, F, gate);
            be.gather_rows(gate_up, halves + n, c, F, up);
        }
        be.gated_act(Activation::GeLUTanh, gate, up, c * F, gate);
        be.matmul(expert_matrix(down, e), gate, c, x_e);
        be.scatter_add_rows(out, x_e, grp_rows + at, grp_w + at, c, E);
    }
}

}  // namespace

class Gemma4Arch final : public Architecture {
public:
    void read_hparams(const GGUFFile& f, HParams& hp) const override {
        hp.rope_neox = true;
        check_experts(f, hp, /*allowed=*/true, /*required=*/false);
        if (hp.n_expert == 0 && f.find_tensor("blk.0.ffn_gate_inp.weight"))
            fail(f.path(), ": tensor 'blk.0.ffn_gate_inp.weight' (a mixture's router) but no gemma4.expert_count");
        // Every layer of a mixture has its experts' gate and up either fused (as llama.cpp's converter writes
        // them from transformers' gate_up_proj) or as two tensors (llama.cpp reads both), never both.
        for (int32_t l = 0; l < hp.n_layer && hp.n_expert > 0; ++l) {
            const std::string p = "blk." + std::to_string(l) + ".";
            const bool fused = f.find_tensor(p + "ffn_gate_up_exps.weight") != nullptr;
            const bool gate = f.find_tensor(p + "ffn_gate_exps.weight") != nullptr;
            const bool up = f.find_tensor(p + "ffn_up_exps.weight") != nullptr;
            if (fused && (gate || up))
                fail(f.path(), ": gemma4 layer ", l, " has both '", p, "ffn_gate_up_exps.weight' and '", p,
                     gate ? "ffn_gate_exps" : "ffn_up_exps",
                     ".weight': the experts' gate and up are either fused or separate, not both");
            if (!fused && !(gate && up))
                fail(f.path(), ": gemma4 has ", hp.n_expert, " experts but tensor '", p,
                     gate || up ? (gate ? "ffn_up_exps" : "ffn_gate_exps") : "ffn_gate_up_exps", ".weight' is missing",
                     gate || up ? " (separate experts need both ffn_gate_exps and ffn_up_exps)"
                                : " (or the separate ffn_gate_exps and ffn_up_exps)");
        }
        if (!f.find("gemma4.attention.sliding_window_pattern"))
            fail(f.path(), ": gemma4.attention.sliding_window_pattern is missing (which layers slide)");
        read_swa_pattern(f, "gemma4", 1, hp);
        hp.n_swa = (int32_t)f.get_uint("gemma4.attention.sliding_window");
        if (hp.n_swa <= 0) fail(f.path(), ": gemma4.attention.sliding_window must be positive, got ", hp.n_swa);
        hp.rope_base_swa = (float)f.get_float("gemma4.rope.freq_base_swa", 10000.0);
        hp.final_softcap = (float)f.get_float("gemma4.final_logit_softcapping", 0.0);
        if (!(hp.final_softcap >= 0.0f) || std::isinf(hp.final_softcap))
            fail(f.path(), ": gemma4.final_logit_softcapping must be positive or absent, got ", hp.final_softcap);

        // The global layers' head size is attention.key_length (hp.head_dim), the sliding ones' key_length_swa.
        const int32_t d_swa = (int32_t)f.get_uint("gemma4.attention.key_length_swa", (uint64_t)hp.head_dim);
        const int64_t v_swa = (int64_t)f.get_uint("gemma4.attention.value_length_swa", (uint64_t)d_swa);
        if (d_swa <= 0 || d_swa % 2 != 0 || v_swa != d_swa)
            fail(f.path(), ": gemma4.attention.key_length_swa ", d_swa, " and value_length_swa ", v_swa,
                 " must be equal, positive and even");
        hp.n_rot_swa = (int32_t)f.get_uint("gemma4.rope.dimension_count_swa", (uint64_t)d_swa);
        if (hp.n_rot_swa <= 0 || hp.n_rot_swa % 2 != 0 || hp.n_rot_swa > d_swa)
            fail(f.path(), ": gemma4.rope.dimension_count_swa ", hp.n_rot_swa, " must be even and between 2 and ",
                 d_swa);
        hp.head_dim_layer.resize(hp.n_layer);
        for (int32_t l = 0; l < hp.n_layer; ++l) hp.head_dim_layer[l] = hp.swa_layer[l] ? d_swa : hp.head_dim;

        // The last shared_kv_layers layers keep no KV: each attends over the last earlier layer of its
        // kind (sliding or global) that keeps its own.
        const int64_t n_shared = (int64_t)f.get_uint("gemma4.attention.shared_kv_layers", 0);
        if (n_shared >= hp.n_layer)
            fail(f.path(), ": gemma4.attention.shared_kv_layers ", n_shared, " must be below block_count ", hp.n_layer);
        const int32_t first_shared = hp.n_layer - (int32_t)n_shared;
        hp.kv_from.assign(hp.n_layer, -1);
        for (int32_t l = first_shared; l < hp.n_layer; ++l) {
            for (int32_t s = first_shared - 1; s >= 0 && hp.kv_from[l] < 0; --s)
                if (hp.swa_layer[s] == hp.swa_layer[l]) hp.kv_from[l] = s;
            if (hp.kv_from[l] < 0)
                fail(f.path(), ": layer ", l, " shares KV (gemma4.attention.shared_kv_layers ", n_shared,
                     ") but no earlier layer of its kind keeps any");
        }

        hp.n_embd_per_layer = (int32_t)f.get_uint("gemma4.embedding_length_per_layer_input", 0);
        hp.layer_scale.resize(hp.n_layer);
        bool any_scale = false;
        for (int32_t l = 0; l < hp.n_layer; ++l) {
            hp.layer_scale[l] = layer_scale(f, l);
            any_scale = any_scale || hp.layer_scale[l] != 1.0f;
        }
        if (!any_scale) hp.layer_scale.clear();
    }
    std::vector<TensorSpec> block_tensors(const HParams& hp) const override { return layer_tensors(hp, 0); }
    std::vector<TensorSpec> layer_tensors(const HParams& hp, int32_t l) const override {
        const int64_t E = hp.n_embd, F = hp.layer_n_ff(l), D = hp.layer_head_dim(l), P = hp.n_embd_per_layer;
        const int64_t QW = (int64_t)hp.n_head * D, KW = (int64_t)hp.layer_n_head_kv(l) * D;
        std::vector<TensorSpec> t = {
            {Role::attn_norm, "attn_norm.weight", {E}},
            {Role::wq, "attn_q.weight", {E, QW}},
            {Role::q_norm, "attn_q_norm.weight", {D}},
            {Role::wo, "attn_output.weight", {QW, E}},
            {Role::post_attn_norm, "post_attention_norm.weight", {E}},
            {Role::ffn_norm, "ffn_norm.weight", {E}},
            {Role::gate, "ffn_gate.weight", {E, F}},
            {Role::up, "ffn_up.weight", {E, F}},
            {Role::down, "ffn_down.weight", {F, E}},
            {Role::post_ffn_norm, "post_ffw_norm.weight", {E}},
        };
        if (hp.kv_layer(l) == l) {
            t.push_back({Role::wk, "attn_k.weight", {E, KW}});
            t.push_back({Role::k_norm, "attn_k_norm.weight", {D}});
            // Absent where the values are the keys' projection (attention_k_eq_v).
            t.push_back({Role::wv, "attn_v.weight", {E, KW}, /*optional=*/true});
        }
        if (hp.n_expert > 0) {
            const int64_t X = hp.n_expert, FX = hp.n_ff_exp;
            const std::vector<TensorSpec> moe = {
                {Role::router, "ffn_gate_inp.weight", {E, X}},
                {Role::router_scale, "ffn_gate_inp.scale", {E}},
                // Fused gate and up, or the two apart (read_hparams has checked the file has one of them).
                {Role::gate_exps, "ffn_gate_up_exps.weight", {E, 2 * FX, X}, /*optional=*/true},
                {Role::gate_exps, "ffn_gate_exps.weight", {E, FX, X}, /*optional=*/true},
                {Role::up_exps, "ffn_up_exps.weight", {E, FX, X}, /*optional=*/true},
                {Role::down_exps, "ffn_down_exps.weight", {FX, E, X}},
                {Role::down_exps_scale, "ffn_down_exps.scale", {X}, /*optional=*/true},
                {Role::ffn_norm_2, "pre_ffw_norm_2.weight", {E}},
                {Role::post_ffn_norm_1, "post_ffw_norm_1.weight", {E}},
                {Role::post_ffn_norm_2, "post_ffw_norm_2.weight", {E}},
            };
            t.insert(t.end(), moe.begin(), moe.end());
        }
        if (P > 0) {
            t.push_back({Role::ple_gate, "inp_gate.weight", {E, P}});
            t.push_back({Role::ple_proj, "proj.weight", {P, E}});
            t.push_back({Role::ple_post_norm, "post_norm.weight", {E}});
            TensorSpec proj{Role::ple_model_proj, "per_layer_model_proj.weight", {E, P}};
            proj.slice = RowSlice{l * P, hp.n_layer * P};
            proj.global = true;
            t.push_back(proj);
            TensorSpec norm{Role::ple_model_norm, "per_layer_proj_norm.weight", {P}};
            norm.global = true;
            t.push_back(norm);
        }
        return t;
    }
    float embd_scale(const HParams& hp) const override { return std::sqrt((float)hp.n_embd); }
    LayerConfig layer_config(const HParams& hp, int32_t l, const RopeParams& rope) const override {
        LayerConfig c = Architecture::layer_config(hp, l, rope);
        c.shape.scale = 1.0f;   // q and k are RMS-normed instead
        if (hp.swa_layer[l]) {
            c.shape.window = hp.n_swa;
            // The global layers' rope (the model's: proportional through rope_freqs) is not theirs.
            c.rope = RopeParams{};
            c.rope.base = hp.rope_base_swa;
            c.rope.head_dim = hp.layer_head_dim(l);
            c.rope.n_rot = hp.n_rot_swa == c.rope.head_dim ? 0 : hp.n_rot_swa;
            c.rope.neox = true;
        }
        if (!hp.layer_scale.empty()) c.out_scale = hp.layer_scale[l];
        return c;
    }
    const float* forward_block(const BlockRun& r) const override {
        Backend& be = r.be;
        const BlockBuffers& b = r.buf;
        const AttentionShape& sh = r.cfg.shape;
        const int32_t n = r.n_tok, E = r.hp.n_embd;
        const int64_t nE = (int64_t)n * E;
        const float eps = r.hp.rms_eps;
        be.add_rmsnorm(r.x, r.residual, r.w.v(Role::attn_norm), n, E, eps, b.xn);
        // Layers sharing an earlier layer's KV have no K projection; r.kv is that layer's.
        const bool own_kv = r.w.m(Role::wk)->data != nullptr;
        if (own_kv) {
            const Weight* wv = r.w.m(Role::wv)->data ? r.w.m(Role::wv) : r.w.m(Role::wk);
            const Weight* ws[3] = {r.w.m(Role::wq), r.w.m(Role::wk), wv};
            float* ys[3] = {b.q, b.k, b.v};
            be.matmul_many(ws, ys, 3, b.xn, n);
            be.head_rmsnorm(b.k, r.w.v(Role::k_norm), n, sh.n_head_kv, sh.head_dim, eps);
            be.head_rmsnorm(b.v, nullptr, n, sh.n_head_kv, sh.head_dim, eps);
            be.rope(b.k, n, sh.n_head_kv, r.cfg.rope);
        } else {
            be.matmul(*r.w.m(Role::wq), b.xn, n, b.q);
        }
        be.head_rmsnorm(b.q, r.w.v(Role::q_norm), n, sh.n_head, sh.head_dim, eps);
        be.rope(b.q, n, sh.n_head, r.cfg.rope);
        if (own_kv) be.kv_store(r.kv, b.k, b.v, n);
        be.attn_out(r.kv, sh, *r.w.m(Role::wo), n, b, r.out_a);
        be.rmsnorm(r.out_a, r.w.v(Role::post_attn_norm), n, E, eps, r.out_b);
        be.ffn(ffn_weights(r, Activation::GeLUTanh), r.x, r.out_b, n, b, r.out_a);
        if (r.hp.n_expert > 0) {
            // The dense MLP and the experts read the same residual x, each normed after its output.
            be.rmsnorm(r.out_a, r.w.v(Role::post_ffn_norm_1), n, E, eps, r.out_a);
            gemma4_experts(r, r.out_b, r.out_b);
            be.rmsnorm(r.out_b, r.w.v(Role::post_ffn_norm_2), n, E, eps, r.out_b);
            be.add(r.out_a, r.out_b, nE);
        }
        be.rmsnorm(r.out_a, r.w.v(Role::post_ffn_norm), n, E, eps, r.out_b);
        if (r.per_layer) {
            be.add(r.x, r.out_b, nE);
            // The layer's input: (rmsnorm(its rows of per_layer_model_proj x embd / sqrt(n_embd)) + its
            // token rows * sqrt(P)) / sqrt(2); then x's gate GeLU(inp_gate x) times it, projected and normed.
            const int32_t P = r.hp.n_embd_per_layer;
            const int64_t nP = (int64_t)n * P;
            be.matmul(*r.w.m(Role::ple_model_proj), r.embd, n, b.up);
            be.scale_softcap(b.up, nP, 1.0f / std::sqrt((float)E), 0.0f);
            be.rmsnorm(b.up, r.w.v(Role::ple_model_norm), n, P, eps, b.up);
            be.scale_softcap(r.per_layer, nP, std::sqrt((float)P), 0.0f);
            be.add(b.up, r.per_layer, nP);
            be.scale_softcap(b.up, nP, 1.0f / std::sqrt(2.0f), 0.0f);
            be.matmul(*r.w.m(Role::ple_gate), r.x, n, b.gate);
            be.gated_act(Activation::GeLUTanh, b.gate, b.up, nP, b.gate);
            be.matmul(*r.w.m(Role::ple_proj), b.gate, n, r.out_a);
            be.rmsnorm(r.out_a, r.w.v(Role::ple_post_norm), n, E, eps, r.out_b);
        }
        if (r.cfg.out_scale == 1.0f) return r.out_b;
        // The whole hidden state is scaled, so the block adds its output itself.
        be.add(r.x, r.out_b, nE);
        be.scale_softcap(r.x, nE, r.cfg.out_scale, 0.0f);
        return nullptr;
    }
    LogitMap logit_map(const HParams& hp) const override { return {1.0f, hp.final_softcap}; }
    const char* experts_stay_with_block() const override {
        return "its experts are composed from the contract's primitives (no moe op) and run on their block's "
               "backend only";
    }
};

const Architecture& gemma4_architecture() {
    static const Gemma4Arch arch;
    return arch;
}

}  // namespace ember
