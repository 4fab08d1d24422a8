// The arithmetic of one CPU attention unit (cpu_attention.cpp), in the order a scalar loop
// gives it: every q.k dot a sequential sum over the head dimension, every output element a
// sequential sum over positions, each product rounded before it is added (no FMA: these files
// build with -ffp-contract=off). The SIMD versions keep that order lane for lane, so every
// level returns the same bits; the scalar one is the reference.
#pragma once
#include <cstdint>

#include "cpu/cpu_kernels.h"

namespace ember {

constexpr int kAttentionLanes = 16;   // positions per transposed key group

struct AttentionMath {
    // prob[p] = (sum_i q[i] * k_p[i]) * scale for the n_groups * 16 positions of kt, which holds
    // keys transposed in groups of 16: k_p[i] = kt[(p / 16) * D * 16 + i * 16 + p % 16].
    void (*scores)(const float* q, const float* kt, int32_t D, int32_t n_groups, float scale, float* prob);
    // y[j] = x[j] * mul, rounded through f16 when `to_f16` (attention operands of an f16 cache).
    void (*scale_round)(const float* x, int32_t n, float mul, bool to_f16, float* y);
    // o[i] = sum_p w[p] * v[p * D + i] for p < len.
    void (*weighted_sum)(const float* w, const float* v, int32_t D, int32_t len, float* o);
    // weighted_sum for the n_heads heads of a GQA group over f16 rows read where they lie:
    // o[h * o_stride + i] = sum_p w[h * w_stride + p] * rows[p][i] (as f32) for p < len. Each row is
    // read and converted once for all the heads (D % 16 == 0 at the SIMD levels).
    void (*weighted_sum_f16)(const float* w, int64_t w_stride, int32_t n_heads, const uint16_t* const* rows, int32_t D,
                             int32_t len, float* o, int64_t o_stride);
    // dst[j] = the f16 value src[j] as f32.
    void (*f16_to_f32)(const uint16_t* src, int32_t n, float* dst);
    // dst[j] = src[j] rounded to f16 (float_to_half's bits: nearest even, NaNs kept quiet).
    void (*f32_to_f16)(const float* src, int32_t n, uint16_t* dst);
    // x[j] = expf(x[j] - m) (std::exp's bits at every level: the softmax numerators).
    void (*exp_shifted)(float* x, int32_t n, float m);
    // The largest of x[0..n), NaNs skipped (-inf when there is nothing else). Exact at any width:
    // only the sign of a zero result can depend on the order, and x - m does not.
    float (*max)(const float* x, int32_t n);
    // One transposed key group from 16 f16 key rows (row l at rows + l * row_stride, D values):
    // kt[i * 16 + l] = row l's value i as f32. Data movement only (what f16_to_f32 of each row
    // and a scatter would give). The SIMD levels need D % 16 == 0, as scores does.
    void (*gather_keys16_f16)(const uint16_t* rows, int64_t row_stride, int32_t D, float* kt);
};

// exp_shifted's scalar loop, which the levels without a vector expf of std::exp's bits share.
void exp_shifted_scalar(float* x, int32_t n, float m);

extern const AttentionMath kAttentionMathScalar;
extern const AttentionMath kAttentionMathAvx2;
extern const AttentionMath kAttentionMathAvx512;
extern const AttentionMath kAttentionMathNeon;   // ARM64 (the scalar table on other targets)

// The table of a SIMD level (the backend's, the one its vec_dot uses); the scalar reference for
// head dimensions that are not a multiple of 16.
const AttentionMath& attention_math(int32_t head_dim, SimdLevel level);

}  // namespace ember
