// Scalar reference of the attention arithmetic (attention_math.h) and the choice of level.
#include "cpu/attention_math.h"

#include <cmath>

#include "cpu/cpu_kernels.h"
#include "quant/half.h"

namespace ember {
namespace {

void scores(const float* q, const float* kt, int32_t D, int32_t n_groups, float scale, float* prob) {
    for (int32_t g = 0; g < n_groups; ++g) {
        float acc[kAttentionLanes] = {};
        const float* k = kt + (int64_t)g * D * kAttentionLanes;
        for (int32_t i = 0; i < D; ++i)
            for (int l = 0; l < kAttentionLanes; ++l) acc[l] += q[i] * k[i * kAttentionLanes + l];
        for (int l = 0; l < kAttentionLanes; ++l) prob[g * kAttentionLanes + l] = acc[l] * scale;
    }
}

void scale_round(const float* x, int32_t n, float mul, bool to_f16, float* y) {
    for (int32_t j = 0; j < n; ++j) {
        const float v = x[j] * mul;
        y[j] = to_f16 ? half_to_float(float_to_half(v)) : v;
    }
}

void weighted_sum(const float* w, const float* v, int32_t D, int32_t len, float* o) {
    for (int32_t i = 0; i < D; ++i) o[i] = 0.f;
    for (int32_t p = 0; p < len; ++p)
        for (int32_t i = 0; i < D; ++i) o[i] += w[p] * v[(int64_t)p * D + i];
}

void weighted_sum_f16(const float* w, int64_t w_stride, int32_t n_heads, const uint16_t* const* rows, int32_t D,
                      int32_t len, float* o, int64_t o_stride) {
    for (int32_t h = 0; h < n_heads; ++h) {
        float* oh = o + h * o_stride;
        for (int32_t i = 0; i < D; ++i) oh[i] = 0.f;
        for (int32_t p = 0; p < len; ++p)
            for (int32_t i = 0; i < D; ++i) oh[i] += w[h * w_stride + p] * half_to_float(rows[p][i]);
    }
}

void f16_to_f32(const uint16_t* src, int32_t n, float* dst) {
    for (int32_t j = 0; j < n; ++j) dst[j] = half_to_float(src[j]);
}

void f32_to_f16(const float* src, int32_t n, uint16_t* dst) {
    for (int32_t j = 0; j < n; ++j) dst[j] = float_to_half(src[j]);
}

float max(const float* x, int32_t n) {
    float m = -INFINITY;
    for (int32_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
    return m;
}

void gather_keys16_f16(const uint16_t* rows, int64_t row_stride, int32_t D, float* kt) {
    for (int l = 0; l < kAttentionLanes; ++l)
        for (int32_t i = 0; i < D; ++i) kt[i * kAttentionLanes + l] = half_to_float(rows[l * row_stride + i]);
}

}  // namespace

const AttentionMath kAttentionMathScalar{scores,     scale_round,        weighted_sum, weighted_sum_f16, f16_to_f32,
                                         f32_to_f16, exp_shifted_scalar, max,          gather_keys16_f16};

void exp_shifted_scalar(float* x, int32_t n, float m) {
    for (int32_t j = 0; j < n; ++j) x[j] = std::exp(x[j] - m);
}

const AttentionMath& attention_math(int32_t head_dim, SimdLevel level) {
    if (head_dim % kAttentionLanes != 0) return kAttentionMathScalar;
    switch (level) {
        case SimdLevel::avx512: return kAttentionMathAvx512;
        case SimdLevel::avx2: return kAttentionMathAvx2;
        case SimdLevel::neon: return kAttentionMathNeon;
        case SimdLevel::scalar: break;
    }
    return kAttentionMathScalar;
}

}  // namespace ember
