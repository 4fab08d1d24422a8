// The CPU's Mamba2 selective scan (Backend::ssm_scan): the exact token-by-token recurrence of each
// head's state, the heads spread over the thread pool.
#include <cmath>

#include "cpu/cpu_backend.h"

namespace ember {

namespace {

constexpr int kLanes = 8;   // partial sums of a state row's dot product with C

float softplus(float x) { return x > kSoftplusThreshold ? x : std::log1p(std::exp(x)); }

// s = s * decay + b * x_dt along one state row; returns s . c. The partial sums run in lanes
// (which vectorize) and meet in a fixed order, so every call sums alike.
float scan_row(float* s, const float* b, const float* c, float decay, float x_dt, int32_t n) {
    float acc[kLanes] = {};
    int32_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int k = 0; k < kLanes; ++k) {
            const float v = s[j + k] * decay + b[j + k] * x_dt;
            s[j + k] = v;
            acc[k] += v * c[j + k];
        }
    for (int k = 0; j < n; ++j, ++k) {
        const float v = s[j] * decay + b[j] * x_dt;
        s[j] = v;
        acc[k] += v * c[j];
    }
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void scan_head(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D, int32_t n_tok,
               const SsmShape& s, int32_t h, float* S, float* y) {
    const int64_t inner = s.inner(), width = s.xbc_width();
    const int32_t hd = s.head_dim, ds = s.d_state, g = h / (s.n_head / s.n_group);
    const float a = A[h], bias = dt_bias ? dt_bias[h] : 0.0f;
    for (int32_t t = 0; t < n_tok; ++t) {
        const float* row = xbc + t * width;
        const float* x = row + (int64_t)h * hd;
        const float* b = row + inner + (int64_t)g * ds;
        const float* c = b + (int64_t)s.n_group * ds;
        const float d = softplus(dt[(int64_t)t * s.n_head + h] + bias);
        const float decay = std::exp(d * a);
        float* out = y + t * inner + (int64_t)h * hd;
        for (int32_t i = 0; i < hd; ++i) {
            const float sum = scan_row(S + (int64_t)i * ds, b, c, decay, x[i] * d, ds);
            out[i] = D ? sum + D[h] * x[i] : sum;
        }
    }
}

}  // namespace

void CpuBackend::ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                          int32_t n_tok, const SsmShape& shape, float* state, float* y) {
    check_ssm_shape(shape, n_tok, "cpu ssm_scan");
    const int64_t per_head = (int64_t)shape.head_dim * shape.d_state;
    pool_.parallel_for(shape.n_head, 1, [&](int64_t b, int64_t e) {
        for (int64_t h = b; h < e; ++h)
            scan_head(xbc, dt, A, dt_bias, D, n_tok, shape, (int32_t)h, state + h * per_head, y);
    });
}

}  // namespace ember
