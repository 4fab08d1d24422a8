// Q4_0's, Q4_1's, Q5_0's and Q5_1's quantizers with an importance matrix, as llama-quantize's (ggml's quantize_q4_0
// etc. given quant_weights): per block of 32, weights the importance times sqrt(sigma2 + x^2) with sigma2 the
// row's mean square; Q4_0 / Q5_0 fit a signed scale over 19 grids, Q4_1 / Q5_1 a scale and a min over 38.
#include <cmath>
#include <cstring>

#include "quant/decode.h"
#include "quant/kernels.h"
#include "quant/quant_weighted.h"

// ggml rounds each product and sum on its own (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {
namespace {

float row_sigma2(const float* x, int64_t n) {
    float sum_x2 = 0;
    for (int64_t j = 0; j < n; ++j) sum_x2 += x[j] * x[j];
    return sum_x2 / float(n);
}

void block_weights(const float* x, const float* qw, float sigma2, float* w) {
    for (int j = 0; j < 32; ++j) w[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

// Levels of 32 values: the low nibbles as value j | value j + 16 << 4, bit 4 of value j as bit j of qh.
void pack_5bit(const uint8_t* L, uint8_t* qs, uint8_t* qh_bytes) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        qs[j] = uint8_t((L[j] & 0x0F) | (L[j + 16] & 0x0F) << 4);
        qh |= uint32_t(L[j] >> 4 & 1) << j | uint32_t(L[j + 16] >> 4 & 1) << (j + 16);
    }
    std::memcpy(qh_bytes, &qh, 4);
}

}  // namespace

void quantize_q4_0_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    BlockQ4_0* y = static_cast<BlockQ4_0*>(dst);
    const float sigma2 = row_sigma2(src, n);
    float w[32];
    int8_t L[32];
    for (int64_t ib = 0; ib < n / 32; ++ib, src += 32, qw += 32) {
        block_weights(src, qw, sigma2, w);
        y[ib].d = float_to_half(fit_symmetric_weighted(32, 8, src, L, w));
        for (int j = 0; j < 16; ++j) y[ib].qs[j] = uint8_t(L[j] | L[j + 16] << 4);
    }
}

void quantize_q5_0_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    BlockQ5_0* y = static_cast<BlockQ5_0*>(dst);
    const float sigma2 = row_sigma2(src, n);
    float w[32];
    int8_t L[32];
    for (int64_t ib = 0; ib < n / 32; ++ib, src += 32, qw += 32) {
        block_weights(src, qw, sigma2, w);
        y[ib].d = float_to_half(fit_symmetric_weighted(32, 16, src, L, w));
        pack_5bit(reinterpret_cast<const uint8_t*>(L), y[ib].qs, y[ib].qh);
    }
}

void quantize_q4_1_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    BlockQ4_1* y = static_cast<BlockQ4_1*>(dst);
    const float sigma2 = row_sigma2(src, n);
    float w[32], min;
    uint8_t L[32];
    for (int64_t ib = 0; ib < n / 32; ++ib, src += 32, qw += 32) {
        block_weights(src, qw, sigma2, w);
        y[ib].d = float_to_half(fit_scale_min_weighted(32, 15, src, w, L, min));
        y[ib].m = float_to_half(-min);
        for (int j = 0; j < 16; ++j) y[ib].qs[j] = uint8_t(L[j] | L[j + 16] << 4);
    }
}

void quantize_q5_1_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    BlockQ5_1* y = static_cast<BlockQ5_1*>(dst);
    const float sigma2 = row_sigma2(src, n);
    float w[32], min;
    uint8_t L[32];
    for (int64_t ib = 0; ib < n / 32; ++ib, src += 32, qw += 32) {
        block_weights(src, qw, sigma2, w);
        y[ib].d = float_to_half(fit_scale_min_weighted(32, 31, src, w, L, min));
        y[ib].m = float_to_half(-min);
        pack_5bit(L, y[ib].qs, y[ib].qh);
    }
}

}  // namespace ember
