// Q4_K's, Q5_K's and Q6_K's quantizers with an importance matrix, as llama-quantize's (ggml's quantize_q4_K etc.
// given quant_weights): Q4_K / Q5_K fit each 32 values with a scale and a min (weights the importance times
// sqrt(sigma2 + x^2)), then the super-block's 6-bit scales and mins by weighted search; Q6_K fits each 16 with a
// signed scale weighted by the importances themselves.
#include <cmath>
#include <cstring>

#include "quant/decode.h"
#include "quant/kernels.h"
#include "quant/quant_grid_search.h"
#include "quant/quant_weighted.h"

// ggml rounds each product and sum on its own (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {
namespace {

// The 8 sub-blocks' levels L (0..nmax), d, dmin and packed 6-bit scales of one Q4_K / Q5_K super-block.
// Q5_K clamps the scale steps to 63 (Q4_K stores them as they come, as ggml's).
void fit_superblock(const float* x, const float* qw, int nmax, bool clamp_steps, uint16_t& d_out, uint16_t& dmin_out,
                    uint8_t* packed, uint8_t* L) {
    float sum_x2 = 0;
    for (int l = 0; l < QK_K; ++l) sum_x2 += x[l] * x[l];
    const float sigma2 = 2 * sum_x2 / QK_K;
    float w[32], sw[8], scales[8], mins[8];
    for (int j = 0; j < 8; ++j) {
        for (int l = 0; l < 32; ++l) w[l] = qw[32 * j + l] * std::sqrt(sigma2 + x[32 * j + l] * x[32 * j + l]);
        sw[j] = 0;
        for (int l = 0; l < 32; ++l) sw[j] += w[l];
        scales[j] = fit_scale_min_weighted(32, nmax, x + 32 * j, w, L + 32 * j, mins[j]);
    }
    uint8_t Ls[8], Lm[8];
    const float d_block = fit_levels_upward(8, 63, scales, Ls, sw);
    const float m_block = fit_levels_upward(8, 63, mins, Lm, sw);
    std::memset(packed, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; ++j) {
        const uint8_t ls = clamp_steps && Ls[j] > 63 ? 63 : Ls[j], lm = clamp_steps && Lm[j] > 63 ? 63 : Lm[j];
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = uint8_t((ls & 0xF) | (lm & 0xF) << 4);
            packed[j - 4] |= uint8_t((ls >> 4) << 6);
            packed[j] |= uint8_t((lm >> 4) << 6);
        }
    }
    d_out = float_to_half(d_block);
    dmin_out = float_to_half(m_block);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, packed, sc, m);
        const float d = half_to_float(d_out) * sc;
        if (!d) continue;
        const float dm = half_to_float(dmin_out) * m;
        for (int i = 0; i < 32; ++i)
            L[32 * j + i] = uint8_t(std::clamp(nearest_even((x[32 * j + i] + dm) / d), 0, nmax));
    }
}

}  // namespace

void quantize_q4_k_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    BlockQ4_K* y = static_cast<BlockQ4_K*>(dst);
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K, qw += QK_K) {
        fit_superblock(src, qw, 15, false, y[i].d, y[i].dmin, y[i].scales, L);
        for (int c = 0; c < 4; ++c)
            for (int l = 0; l < 32; ++l) y[i].qs[32 * c + l] = uint8_t(L[64 * c + l] | L[64 * c + 32 + l] << 4);
    }
}

void quantize_q5_k_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    BlockQ5_K* y = static_cast<BlockQ5_K*>(dst);
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K, qw += QK_K) {
        fit_superblock(src, qw, 31, true, y[i].d, y[i].dmin, y[i].scales, L);
        std::memset(y[i].qh, 0, sizeof y[i].qh);
        for (int c = 0; c < 4; ++c)
            for (int l = 0; l < 32; ++l) {
                const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                y[i].qs[32 * c + l] = uint8_t((lo & 0x0F) | (hi & 0x0F) << 4);
                y[i].qh[l] |= uint8_t((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
            }
    }
}

void quantize_q6_k_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    BlockQ6_K* y = static_cast<BlockQ6_K*>(dst);
    int8_t L[QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K, qw += QK_K) {
        float max_scale = 0, max_abs = 0;
        for (int g = 0; g < 16; ++g) {
            scales[g] = fit_symmetric_weighted(16, 32, src + 16 * g, L + 16 * g, qw + 16 * g);
            if (std::fabs(scales[g]) > max_abs) {
                max_abs = std::fabs(scales[g]);
                max_scale = scales[g];
            }
        }
        if (max_abs < 1e-15f) {
            std::memset(&y[i], 0, sizeof(BlockQ6_K));
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = float_to_half(1 / iscale);
        for (int g = 0; g < 16; ++g) y[i].scales[g] = int8_t(std::min(127, nearest_even(iscale * scales[g])));
        for (int g = 0; g < 16; ++g) {
            const float d = half_to_float(y[i].d) * y[i].scales[g];
            if (!d) continue;
            for (int l = 0; l < 16; ++l)
                L[16 * g + l] = int8_t(std::clamp(nearest_even(src[16 * g + l] / d), -32, 31) + 32);
        }
        for (int h = 0; h < 2; ++h) {
            const int8_t* q = L + 128 * h;
            for (int l = 0; l < 32; ++l) {
                const int q1 = q[l], q2 = q[l + 32], q3 = q[l + 64], q4 = q[l + 96];
                y[i].ql[64 * h + l] = uint8_t((q1 & 0x0F) | (q3 & 0x0F) << 4);
                y[i].ql[64 * h + l + 32] = uint8_t((q2 & 0x0F) | (q4 & 0x0F) << 4);
                y[i].qh[32 * h + l] = uint8_t(q1 >> 4 | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
        }
    }
}

}  // namespace ember
