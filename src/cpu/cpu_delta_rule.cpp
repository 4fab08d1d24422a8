// The CPU's gated delta rule (Backend::gated_delta_rule): the exact token-by-token recurrence of
// each v head's state, the heads spread over the thread pool.
#include <cmath>
#include <vector>

#include "cpu/cpu_backend.h"

namespace ember {

namespace {

// dst = src / sqrt(sum src^2 + eps) * scale
void l2_normalize(const float* src, int32_t n, float scale, float* dst) {
    float ss = 0.0f;
    for (int32_t i = 0; i < n; ++i) ss += src[i] * src[i];
    const float m = scale / std::sqrt(ss + kDeltaRuleNormEps);
    for (int32_t i = 0; i < n; ++i) dst[i] = src[i] * m;
}

// One v head over every token. The state is [head_k][head_v], so each pass runs along contiguous
// rows: the decay and S^T k in one, the update and S^T q in the other.
void delta_rule_head(const float* q, const float* k, const float* v, const float* g, const float* beta, int32_t n_tok,
                     const DeltaRuleShape& s, int32_t h, float* S, float* out) {
    const int32_t hk = s.head_k, hv = s.head_v, kh = h % s.n_k_heads;
    const int64_t qk_row = (int64_t)s.n_k_heads * hk, v_row = (int64_t)s.n_v_heads * hv;
    std::vector<float> qn(hk), kn(hk), kv(hv), delta(hv);
    const float q_scale = 1.0f / std::sqrt((float)hk);
    for (int32_t t = 0; t < n_tok; ++t) {
        l2_normalize(q + t * qk_row + (int64_t)kh * hk, hk, q_scale, qn.data());
        l2_normalize(k + t * qk_row + (int64_t)kh * hk, hk, 1.0f, kn.data());
        const float decay = std::exp(g[(int64_t)t * s.n_v_heads + h]);
        const float b = beta[(int64_t)t * s.n_v_heads + h];
        const float* vt = v + t * v_row + (int64_t)h * hv;
        float* o = out + t * v_row + (int64_t)h * hv;
        std::fill(kv.begin(), kv.end(), 0.0f);
        for (int32_t i = 0; i < hk; ++i) {
            float* row = S + (int64_t)i * hv;
            const float ki = kn[i];
            for (int32_t j = 0; j < hv; ++j) {
                row[j] *= decay;
                kv[j] += row[j] * ki;
            }
        }
        for (int32_t j = 0; j < hv; ++j) {
            delta[j] = b * (vt[j] - kv[j]);
            o[j] = 0.0f;
        }
        for (int32_t i = 0; i < hk; ++i) {
            float* row = S + (int64_t)i * hv;
            const float ki = kn[i], qi = qn[i];
            for (int32_t j = 0; j < hv; ++j) {
                row[j] += ki * delta[j];
                o[j] += row[j] * qi;
            }
        }
    }
}

}  // namespace

void CpuBackend::gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                  int32_t n_tok, const DeltaRuleShape& shape, float* state, float* out) {
    check_delta_rule_shape(shape, n_tok, "cpu gated_delta_rule");
    const int64_t per_head = (int64_t)shape.head_k * shape.head_v;
    pool_.parallel_for(shape.n_v_heads, 1, [&](int64_t b, int64_t e) {
        for (int64_t h = b; h < e; ++h)
            delta_rule_head(q, k, v, g, beta, n_tok, shape, (int32_t)h, state + h * per_head, out);
    });
}

}  // namespace ember
