// The default composition of Backend::moe over the primitives: route, group the tokens by expert on
// the host, run each used expert on its tokens' rows, scatter the weighted results, add the shared expert.
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "ember/status.h"

namespace ember {

namespace {
// rows [n][dim] in the backend's memory: row r times scale[r] (host), a round trip through the
// host that keeps this composition to the contract's primitives.
void scale_rows_through_host(Backend& be, float* rows, const float* scale, int32_t n, int64_t dim) {
    std::vector<float> h(n * dim);
    be.copy_to_host(h.data(), rows, h.size() * sizeof(float));
    for (int32_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < dim; ++j) h[r * dim + j] *= scale[r];
    be.copy_from_host(rows, h.data(), h.size() * sizeof(float));
}
}  // namespace

void Backend::moe(const MoeWeights& w, const float* xn, int32_t n_tok, const BlockBuffers& b, float* out) {
    const int64_t n_embd = w.router->n_in, n_ff = w.n_ff(), n_exp = w.n_expert, n_used = w.n_used;
    const int64_t rows = n_tok * n_used;
    // Scratch: logits, ids, weights, the grouped rows and their weights; then the routed experts'
    // gathered inputs and gate/up outputs, which the shared expert reuses once they are spent.
    float* s = b.moe;
    float* logits = s;
    auto* ids = reinterpret_cast<int32_t*>(s + n_tok * n_exp);
    float* weights = s + n_tok * n_exp + rows;
    auto* grp_rows = reinterpret_cast<int32_t*>(weights + rows);
    float* grp_w = weights + 2 * rows;
    float* region = aligned_scratch(weights + 3 * rows);

    matmul(*w.router, xn, n_tok, logits);
    if (w.router_bias) add_bias(logits, w.router_bias, n_tok, (int32_t)n_exp);
    moe_route(w, logits, n_tok, ids, weights);

    std::vector<int32_t> ids_h(rows);
    std::vector<float> w_h(rows);
    copy_to_host(ids_h.data(), ids, rows * sizeof(int32_t));
    copy_to_host(w_h.data(), weights, rows * sizeof(float));
    const MoeGroups g = moe_groups(ids_h.data(), w_h.data(), n_tok, (int32_t)n_used, (int32_t)n_exp);
    copy_from_host(grp_rows, g.tok.data(), rows * sizeof(int32_t));
    // Weights that scale the experts' inputs (weight_input) leave the outputs to be summed as they are.
    const std::vector<float> ones(w.weight_input ? rows : 0, 1.0f);
    copy_from_host(grp_w, w.weight_input ? ones.data() : g.weight.data(), rows * sizeof(float));
    const std::vector<float> zeros(n_tok * n_embd, 0.0f);
    copy_from_host(out, zeros.data(), zeros.size() * sizeof(float));

    float* xg = region;
    float* gate = xg + rows * n_embd;
    float* up = gate + rows * n_ff;
    for (int32_t e = 0; e < n_exp; ++e) {
        const int64_t at = g.first[e];
        const int32_t c = int32_t(g.first[e + 1] - at);
        if (c == 0) continue;
        float* x_e = xg + at * n_embd;
        float* g_e = gate + at * n_ff;
        float* u_e = up + at * n_ff;
        gather_rows(xn, grp_rows + at, c, n_embd, x_e);
        if (w.weight_input) scale_rows_through_host(*this, x_e, g.weight.data() + at, c, n_embd);
        const Weight wg = expert_matrix(*w.gate, e), wu = expert_matrix(*w.up, e), wd = expert_matrix(*w.down, e);
        const Weight* ws[2] = {&wg, &wu};
        float* ys[2] = {g_e, u_e};
        matmul_many(ws, ys, 2, x_e, c);
        if (w.gate_bias) add_bias(g_e, w.gate_bias + e * n_ff, c, (int32_t)n_ff);
        if (w.up_bias) add_bias(u_e, w.up_bias + e * n_ff, c, (int32_t)n_ff);
        gated_act(w.act, g_e, u_e, c * n_ff, g_e);
        // The expert's input rows are spent: its output takes their place.
        matmul(wd, g_e, c, x_e);
        if (w.down_bias) add_bias(x_e, w.down_bias + e * n_embd, c, (int32_t)n_embd);
        scatter_add_rows(out, x_e, grp_rows + at, grp_w + at, c, n_embd);
    }
    moe_shared_expert(w, xn, n_tok, region, moe_scratch_floats(n_tok, n_embd, n_ff, n_exp, n_used) - (region - s), out);
}

MoeGroups moe_groups(const int32_t* ids, const float* weights, int32_t n_tok, int32_t n_used, int32_t n_expert) {
    const int64_t rows = int64_t(n_tok) * n_used;
    MoeGroups g;
    g.first.assign(n_expert + 1, 0);
    g.tok.resize(rows);
    g.weight.resize(rows);
    for (int64_t r = 0; r < rows; ++r) ++g.first[ids[r] + 1];
    std::partial_sum(g.first.begin(), g.first.end(), g.first.begin());
    std::vector<int64_t> fill(g.first.begin(), g.first.end() - 1);
    for (int64_t r = 0; r < rows; ++r) {   // r ascends, so each group's tokens do
        const int64_t at = fill[ids[r]]++;
        g.tok[at] = int32_t(r / n_used);
        g.weight[at] = weights[r];
    }
    return g;
}

void Backend::moe_shared_expert(const MoeWeights& w, const float* xn, int32_t n_tok, float* scratch,
                                int64_t scratch_floats, float* out) {
    if (!w.shared_gate) return;
    const int64_t n_embd = w.router->n_in, n_ff_s = w.shared_gate->n_out;
    if (2 * n_tok * n_ff_s + n_tok * n_embd + 2 * n_tok > scratch_floats)
        fail("moe: the shared expert's n_ff ", n_ff_s, " needs more scratch than moe_scratch_floats gives for n_ff ",
             w.n_ff(), "; size BlockBuffers::moe with the larger of the two");
    float* sg = scratch;
    float* su = sg + n_tok * n_ff_s;
    float* sy = su + n_tok * n_ff_s;
    const Weight* ws[2] = {w.shared_gate, w.shared_up};
    float* ys[2] = {sg, su};
    matmul_many(ws, ys, 2, xn, n_tok);
    gated_act(w.act, sg, su, n_tok * n_ff_s, sg);
    matmul(*w.shared_down, sg, n_tok, sy);
    if (!w.shared_gate_inp) {
        add(out, sy, n_tok * n_embd);
        return;
    }
    float* scale = sy + n_tok * n_embd;
    auto* all = reinterpret_cast<int32_t*>(scale + n_tok);
    matmul(*w.shared_gate_inp, xn, n_tok, scale);
    sigmoid(scale, n_tok);
    std::vector<int32_t> iota(n_tok);
    std::iota(iota.begin(), iota.end(), 0);
    copy_from_host(all, iota.data(), n_tok * sizeof(int32_t));
    scatter_add_rows(out, sy, all, scale, n_tok, n_embd);
}

}  // namespace ember
