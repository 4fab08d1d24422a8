// The CPU backend's encoder ops: LayerNorm, the non-gated activations, and bidirectional attention
// over the packed sequences of a batch (no KV cache).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_backend.h"
#include "ember/status.h"

namespace ember {

namespace {

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;

// [first, end) of each token's sequence; fails where a sequence's tokens are not contiguous.
std::vector<std::pair<int32_t, int32_t>> sequence_spans(const BatchInfo& b, int32_t n_tok) {
    if ((int32_t)b.seq.size() < n_tok || (int32_t)b.pos.size() < n_tok)
        fail("encoder_attention: n_tok ", n_tok, " but set_batch gave ", b.seq.size(), " tokens");
    std::vector<std::pair<int32_t, int32_t>> span(n_tok);
    std::vector<bool> seen(std::max(b.n_seq, 1), false);
    for (int32_t t = 0; t < n_tok;) {
        int32_t e = t + 1;
        while (e < n_tok && b.seq[e] == b.seq[t]) ++e;
        const int32_t s = b.seq[t];
        if (s < 0 || s >= b.n_seq) fail("encoder_attention: token ", t, " has sequence ", s, " of ", b.n_seq);
        if (seen[s]) fail("encoder_attention: the tokens of sequence ", s, " are not contiguous in the batch");
        seen[s] = true;
        for (int32_t i = t; i < e; ++i) span[i] = {t, e};
        t = e;
    }
    return span;
}

}  // namespace

void CpuBackend::layernorm(const float* x, const float* gamma, const float* beta, int32_t n_tok, int32_t dim, float eps,
                           float* y) {
    pool_.parallel_for(n_tok, 4, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
            const float* xr = x + t * dim;
            float* yr = y + t * dim;
            // Two passes in double: the mean of rows whose values sit far from zero cancels otherwise.
            double sum = 0.0;
            for (int32_t i = 0; i < dim; ++i) sum += xr[i];
            const double mean = sum / dim;
            double var = 0.0;
            for (int32_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
            const float rstd = (float)(1.0 / std::sqrt(var / dim + eps));
            const float m = (float)mean;
            for (int32_t i = 0; i < dim; ++i) {
                const float v = (xr[i] - m) * rstd * gamma[i];
                yr[i] = beta ? v + beta[i] : v;
            }
        }
    });
}

void CpuBackend::unary(UnaryOp f, float* x, int64_t n) {
    pool_.parallel_for(n, 4096, [&](int64_t b, int64_t e) {
        switch (f) {
            case UnaryOp::GeLUErf:
                for (int64_t i = b; i < e; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kSqrtHalf));
                break;
            case UnaryOp::GeLUTanh:
                for (int64_t i = b; i < e; ++i) {
                    const float v = x[i];
                    x[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
                }
                break;
            case UnaryOp::Tanh:
                for (int64_t i = b; i < e; ++i) x[i] = std::tanh(x[i]);
                break;
            case UnaryOp::ReLUSquared:
                for (int64_t i = b; i < e; ++i) x[i] = x[i] > 0.0f ? x[i] * x[i] : 0.0f;
                break;
        }
    });
}

void CpuBackend::encoder_attention(const float* q, const float* k, const float* v, int32_t n_tok,
                                   const AttentionShape& shape, float* out) {
    const int32_t H = shape.n_head, Hkv = shape.n_head_kv, D = shape.head_dim;
    if (H <= 0 || Hkv <= 0 || H % Hkv != 0 || D <= 0)
        fail("encoder_attention: n_head ", H, " must be a positive multiple of n_head_kv ", Hkv, ", head_dim ", D);
    if (shape.sinks || shape.softcap > 0.0f || shape.chunk != 0)
        fail("encoder_attention takes no attention sinks, soft-capping or chunks");
    if (shape.window < 0) fail("encoder_attention: window must be >= 0, got ", shape.window);
    const auto span = sequence_spans(batch_, n_tok);
    std::vector<int32_t> firsts;
    for (int32_t t = 0; t < n_tok; t = span[t].second) firsts.push_back(t);
    const std::vector<int32_t>& pos = batch_.pos;
    const int64_t qw = (int64_t)H * D, kw = (int64_t)Hkv * D;
    const int32_t group = H / Hkv;
    // One item per (sequence, head). Its keys are transposed to [D][len] first, so that a query's
    // scores and its weighted sum of values are loops over independent elements (vectorized, each
    // element summed in order).
    pool_.parallel_for((int64_t)firsts.size() * H, 1, [&](int64_t b, int64_t e) {
        std::vector<float> kt, p, acc(D);
        for (int64_t item = b; item < e; ++item) {
            const int32_t first = firsts[item / H], h = (int32_t)(item % H), g = h / group;
            const int32_t end = span[first].second, len = end - first;
            kt.resize((size_t)D * len);
            p.resize(len);
            for (int32_t j = 0; j < len; ++j) {
                const float* kj = k + (first + j) * kw + (int64_t)g * D;
                for (int32_t d = 0; d < D; ++d) kt[(size_t)d * len + j] = kj[d];
            }
            for (int32_t i = first; i < end; ++i) {
                const float* qi = q + i * qw + (int64_t)h * D;
                std::fill(p.begin(), p.end(), 0.0f);
                for (int32_t d = 0; d < D; ++d) {
                    const float qd = qi[d];
                    const float* row = &kt[(size_t)d * len];
                    for (int32_t j = 0; j < len; ++j) p[j] += qd * row[j];
                }
                float mx = -INFINITY;
                for (int32_t j = 0; j < len; ++j) {
                    const bool seen = shape.window <= 0 || std::abs(pos[i] - pos[first + j]) < shape.window;
                    p[j] = seen ? p[j] * shape.scale : -INFINITY;
                    mx = std::max(mx, p[j]);
                }
                float sum = 0.0f;
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (int32_t j = 0; j < len; ++j) {
                    if (p[j] == -INFINITY) continue;
                    const float w = std::exp(p[j] - mx);
                    sum += w;
                    const float* vj = v + (first + j) * kw + (int64_t)g * D;
                    for (int32_t d = 0; d < D; ++d) acc[d] += w * vj[d];
                }
                float* o = out + i * qw + (int64_t)h * D;
                for (int32_t d = 0; d < D; ++d) o[d] = acc[d] / sum;
            }
        }
    });
}

}  // namespace ember
