// The CPU's Mamba2 selective scan over a range of heads (Backend::ssm_scan), compiled twice: for
// the build's base ISA (cpu_ssm_scan.cpp) and with AVX2 and FMA (ssm_scan_avx2.cpp). The loops
// live in an anonymous namespace, so each file's copy is its own.
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/ssm_scan.h"

namespace ember {

// Heads [h0, h1) of Backend::ssm_scan with AVX2 and FMA (x86 only).
void ssm_scan_heads_avx2(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                         int32_t n_tok, const SsmShape& s, int64_t h0, int64_t h1, float* state, float* y);

namespace {

constexpr int kSsmLanes = 8;   // partial sums of a state row's dot product with C: one AVX2 vector

inline float softplus(float x) { return x > kSoftplusThreshold ? x : std::log1p(std::exp(x)); }

// s = s * decay + b * x_dt along one state row; returns s . c. Column j's product goes to partial
// sum j % 8 and the eight meet in a fixed order, so every call sums alike.
inline float scan_row(float* s, const float* b, const float* c, float decay, float x_dt, int32_t n) {
    float acc[kSsmLanes] = {};
    int32_t j = 0;
    for (; j + kSsmLanes <= n; j += kSsmLanes)
        for (int k = 0; k < kSsmLanes; ++k) {
            const float v = s[j + k] * decay + b[j + k] * x_dt;
            s[j + k] = v;
            acc[k] += v * c[j + k];
        }
    for (int k = 0; k < kSsmLanes && j < n; ++j, ++k) {
        const float v = s[j] * decay + b[j] * x_dt;
        s[j] = v;
        acc[k] += v * c[j];
    }
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Each head's tokens in order: the exact recurrence, the head's state rows in cache throughout.
inline void scan_heads(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                       int32_t n_tok, const SsmShape& s, int64_t h0, int64_t h1, float* state, float* y) {
    const int64_t inner = s.inner(), width = s.xbc_width();
    const int32_t hd = s.head_dim, ds = s.d_state;
    for (int64_t h = h0; h < h1; ++h) {
        const int64_t g = h / (s.n_head / s.n_group);
        float* S = state + h * hd * ds;
        const float a = A[h], bias = dt_bias ? dt_bias[h] : 0.0f;
        for (int32_t t = 0; t < n_tok; ++t) {
            const float* row = xbc + t * width;
            const float* x = row + h * hd;
            const float* b = row + inner + g * ds;
            const float* c = b + (int64_t)s.n_group * ds;
            const float d = softplus(dt[(int64_t)t * s.n_head + h] + bias);
            const float decay = std::exp(d * a);
            float* out = y + t * inner + h * hd;
            for (int32_t i = 0; i < hd; ++i) {
                const float sum = scan_row(S + (int64_t)i * ds, b, c, decay, x[i] * d, ds);
                out[i] = D ? sum + D[h] * x[i] : sum;
            }
        }
    }
}

}  // namespace
}  // namespace ember
