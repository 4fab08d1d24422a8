// The CPU's moe: the batch's rows grouped by expert, and the matmuls of every used expert handed out
// to the pool as one job per stage, so each chosen expert's weights are read once per step and the
// threads meet a few times per layer instead of a few times per expert.
#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_moe.h"
#include "cpu/isa_kernels.h"

namespace ember {

// The matmuls of one stage: inputs prepared (once per distinct input and format), then the rows of
// all of them handed out together. Each matmul is the kernel matmul would take for its tokens, on
// the same prepared input, so each output has matmul's bits.
void CpuBackend::run_matmuls(std::vector<MatmulRows>& jobs, const std::vector<const float*>& inputs) {
    // Inputs of the same rows in the same format are prepared once (one token: every expert's gate
    // and up read the same row).
    std::map<std::tuple<const float*, int, const void*, int>, size_t> seen;
    std::vector<size_t> offset(jobs.size());
    std::vector<size_t> first_of;   // jobs that prepare their input
    size_t bytes = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const MatmulRows& m = jobs[j];
        const auto key = std::make_tuple(inputs[j], int(m.path), (const void*)m.fast, int(m.act_type));
        const auto [it, fresh] = seen.emplace(key, bytes);
        offset[j] = it->second;
        if (!fresh) continue;
        first_of.push_back(j);
        bytes += (matmul_input_bytes(m) + 63) / 64 * 64;
    }
    if (moe_act_.size() < bytes) moe_act_.resize(bytes);
    uint8_t* act = moe_act_.data();
    pool_.parallel_for((int64_t)first_of.size(), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            const size_t j = first_of[i];
            prepare_matmul_input(jobs[j], inputs[j], act + offset[j]);
        }
    });
    for (size_t j = 0; j < jobs.size(); ++j) jobs[j].act = act + offset[j];

    // Hand-outs of whole kernel tiles, about n_chunks() over all the rows of the stage.
    int64_t total = 0;
    for (const MatmulRows& m : jobs) total += m.w->n_out;
    const int64_t target = std::max<int64_t>(1, total / n_chunks());
    struct Unit {
        size_t job;
        int64_t b, e;
    };
    std::vector<Unit> units;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const int64_t tile = jobs[j].tile(), n_out = jobs[j].w->n_out;
        const int64_t step = std::max<int64_t>(tile, (target + tile - 1) / tile * tile);
        for (int64_t b = 0; b < n_out; b += step) units.push_back({j, b, std::min(n_out, b + step)});
    }
    pool_.parallel_for((int64_t)units.size(), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) jobs[units[i].job].rows(units[i].b, units[i].e);
    });
}

void CpuBackend::moe(const MoeWeights& w, const float* xn, int32_t n_tok, const BlockBuffers& buf, float* out) {
    const int64_t n_embd = w.router->n_in, n_ff = w.n_ff(), n_exp = w.n_expert, n_used = w.n_used;
    const int64_t rows = n_tok * n_used;
    // Scratch: logits, ids, weights, then the routed rows (inputs, then outputs), gate and up; the
    // shared expert reuses what follows the weights.
    float* logits = buf.moe;
    auto* ids = reinterpret_cast<int32_t*>(logits + n_tok * n_exp);
    float* weights = logits + n_tok * n_exp + rows;
    float* xg = weights + rows;
    float* gate = xg + rows * n_embd;
    float* up = gate + rows * n_ff;

    matmul(*w.router, xn, n_tok, logits);
    if (w.router_bias) add_bias(logits, w.router_bias, n_tok, (int32_t)n_exp);
    moe_route(w, logits, n_tok, ids, weights);
    const MoeGroups g = moe_groups(ids, weights, n_tok, (int32_t)n_used, (int32_t)n_exp);

    struct Group {
        int32_t e;
        int64_t at;   // first row in the grouped order
        int32_t c;    // tokens
    };
    std::vector<Group> used;
    for (int32_t e = 0; e < n_exp; ++e)
        if (g.first[e + 1] > g.first[e]) used.push_back({e, g.first[e], int32_t(g.first[e + 1] - g.first[e])});
    // One token: every group's rows are xn itself, no copy, unless the weights scale the rows.
    const bool copy_rows = n_tok > 1 || w.weight_input;
    if (copy_rows)
        pool_.parallel_for(rows, 64, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
                float* y = xg + r * n_embd;
                const float* x = xn + int64_t(g.tok[r]) * n_embd;
                if (!w.weight_input) {
                    std::memcpy(y, x, n_embd * sizeof(float));
                    continue;
                }
                for (int64_t j = 0; j < n_embd; ++j) y[j] = g.weight[r] * x[j];
            }
        });

    std::vector<Weight> ws(3 * used.size());
    std::vector<MatmulRows> jobs;
    std::vector<const float*> inputs;
    for (size_t i = 0; i < used.size(); ++i) {
        const Group& u = used[i];
        ws[3 * i] = expert_matrix(*w.gate, u.e);
        ws[3 * i + 1] = expert_matrix(*w.up, u.e);
        ws[3 * i + 2] = expert_matrix(*w.down, u.e);
        const float* x = copy_rows ? xg + u.at * n_embd : xn;
        for (int k = 0; k < 2; ++k) {
            const Weight& m = ws[3 * i + k];
            jobs.push_back(matmul_kernel(matmul_path(m.type, u.c), m, u.c, (k ? up : gate) + u.at * n_ff));
            inputs.push_back(x);
        }
    }
    run_matmuls(jobs, inputs);

    const GatedActFn act = gated_act_kernel(simd_);
    pool_.parallel_for((int64_t)used.size(), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            const Group& u = used[i];
            float* g_e = gate + u.at * n_ff;
            float* u_e = up + u.at * n_ff;
            if (w.gate_bias) add_bias_rows(g_e, w.gate_bias + u.e * n_ff, u.c, n_ff);
            if (w.up_bias) add_bias_rows(u_e, w.up_bias + u.e * n_ff, u.c, n_ff);
            act(w.act, g_e, u_e, u.c * n_ff, g_e);
        }
    });

    jobs.clear();
    inputs.clear();
    for (size_t i = 0; i < used.size(); ++i) {
        const Group& u = used[i];
        const Weight& m = ws[3 * i + 2];
        jobs.push_back(matmul_kernel(matmul_path(m.type, u.c), m, u.c, xg + u.at * n_embd));
        inputs.push_back(gate + u.at * n_ff);
    }
    run_matmuls(jobs, inputs);
    if (w.down_bias)
        pool_.parallel_for((int64_t)used.size(), 1, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i)
                add_bias_rows(xg + used[i].at * n_embd, w.down_bias + used[i].e * n_embd, used[i].c, n_embd);
        });

    // Each token's experts summed in ascending order from zero, as the default's scatters add them.
    std::vector<std::vector<int64_t>> of_token(n_tok);
    for (int64_t r = 0; r < rows; ++r) of_token[g.tok[r]].push_back(r);
    pool_.parallel_for(n_tok, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
            float* o = out + t * n_embd;
            std::fill(o, o + n_embd, 0.0f);
            for (int64_t r : of_token[t])
                scatter_add_row(o, xg + r * n_embd, w.weight_input ? 1.0f : g.weight[r], n_embd);
        }
    });
    moe_shared_expert(w, xn, n_tok, weights + rows,
                      moe_scratch_floats(n_tok, n_embd, n_ff, n_exp, n_used) - (weights + rows - buf.moe), out);
}

}  // namespace ember
