// The CPU backend's mixture-of-experts primitives (routing, row gather, weighted scatter-add) and the small
// elementwise ops beside them (sigmoid, mul, softplus_gate, copy_rows).
// (No FMA contraction in this file: the scatter's products round as the default composition's do.)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_moe.h"

namespace ember {

namespace {

// MoeWeights::n_group: the experts outside the token's n_group_used best groups can no longer be chosen.
void limit_to_best_groups(const MoeWeights& w, const std::vector<float>& score, std::vector<float>& choose) {
    // Groups add up probabilities, which softmax's logits are not.
    if (w.gating == MoeGating::softmax) choose = score;
    const int32_t per = w.n_expert / w.n_group;
    std::vector<float> group(w.n_group);
    for (int32_t g = 0; g < w.n_group; ++g) {
        const float* c = choose.data() + g * per;
        float best = -INFINITY, second = -INFINITY;
        for (int32_t i = 0; i < per; ++i) {
            if (c[i] > best) second = best, best = c[i];
            else if (c[i] > second) second = c[i];
        }
        group[g] = per > 1 ? best + second : best;
    }
    std::vector<int32_t> order(w.n_group);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return group[a] > group[b]; });
    for (int32_t j = w.n_group_used; j < w.n_group; ++j) std::fill_n(choose.begin() + order[j] * per, per, -INFINITY);
}

}  // namespace

void moe_route_token(const MoeWeights& w, const float* logits, int32_t* ids, float* weights) {
    const int32_t n_exp = w.n_expert, k = w.n_used;
    // The score an expert is chosen by; softmax keeps the logits' order, so it chooses by them.
    std::vector<float> choose(logits, logits + n_exp), score(n_exp);
    if (w.gating == MoeGating::sigmoid) {
        for (int32_t i = 0; i < n_exp; ++i) {
            score[i] = 1.0f / (1.0f + std::exp(-logits[i]));
            choose[i] = w.selection_bias ? score[i] + w.selection_bias[i] : score[i];
        }
    } else if (w.gating == MoeGating::softmax) {
        const float m = *std::max_element(logits, logits + n_exp);
        float sum = 0.0f;
        for (int32_t i = 0; i < n_exp; ++i) sum += score[i] = std::exp(logits[i] - m);
        for (int32_t i = 0; i < n_exp; ++i) score[i] /= sum;
    }
    if (w.n_group > 1) limit_to_best_groups(w, score, choose);
    std::vector<int32_t> order(n_exp);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return choose[a] > choose[b] || (choose[a] == choose[b] && a < b); });
    std::copy(order.begin(), order.begin() + k, ids);
    if (w.gating == MoeGating::topk_softmax) {
        const float m = logits[ids[0]];
        float sum = 0.0f;
        for (int32_t j = 0; j < k; ++j) sum += weights[j] = std::exp(logits[ids[j]] - m);
        for (int32_t j = 0; j < k; ++j) weights[j] /= sum;
    } else {
        for (int32_t j = 0; j < k; ++j) weights[j] = score[ids[j]];
    }
    if (w.norm_topk) {
        float sum = 0.0f;
        for (int32_t j = 0; j < k; ++j) sum += weights[j];
        for (int32_t j = 0; j < k; ++j) weights[j] /= sum;
    }
    for (int32_t j = 0; j < k; ++j) weights[j] *= w.weight_scale;
}

void add_bias_rows(float* x, const float* bias, int64_t n_tok, int64_t dim) {
    for (int64_t t = 0; t < n_tok; ++t)
        for (int64_t j = 0; j < dim; ++j) x[t * dim + j] += bias[j];
}

void scatter_add_row(float* out, const float* y, float scale, int64_t dim) {
    for (int64_t j = 0; j < dim; ++j) out[j] += scale * y[j];
}

void CpuBackend::moe_route(const MoeWeights& w, const float* logits, int32_t n_tok, int32_t* ids, float* weights) {
    pool_.parallel_for(n_tok, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t)
            moe_route_token(w, logits + t * w.n_expert, ids + t * w.n_used, weights + t * w.n_used);
    });
}

void CpuBackend::gather_rows(const float* x, const int32_t* rows, int32_t n_rows, int64_t dim, float* y) {
    for (int32_t r = 0; r < n_rows; ++r) std::memcpy(y + r * dim, x + rows[r] * dim, dim * sizeof(float));
}

void CpuBackend::scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* scale, int32_t n_rows,
                                  int64_t dim) {
    pool_.parallel_for(n_rows, 1, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) scatter_add_row(out + rows[r] * dim, y + r * dim, scale[r], dim);
    });
}

void CpuBackend::sigmoid(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void CpuBackend::mul(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= y[i];
}

void CpuBackend::softplus_gate(float* x, const float* bias, const float* scale, int32_t n_tok, int32_t dim) {
    for (int64_t t = 0; t < n_tok; ++t)
        for (int32_t j = 0; j < dim; ++j) {
            const float v = x[t * dim + j] + bias[j];
            x[t * dim + j] = scale[j] * (v > 20.0f ? v : std::log1p(std::exp(v)));
        }
}

void CpuBackend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                           int64_t n_rows) {
    if (width < 0 || n_rows < 0 || (n_rows > 1 && (dst_stride < width || src_stride < width)))
        fail("copy_rows: width ", width, " and n_rows ", n_rows, " must be >= 0 and the strides (", dst_stride, ", ",
             src_stride, ") at least the width");
    for (int64_t r = 0; r < n_rows; ++r) std::copy_n(src + r * src_stride, width, dst + r * dst_stride);
}

}  // namespace ember
