// Q2_K's and Q3_K's quantizers as ggml's reference ones (quantize_row_q2_K_ref / q3_K_ref), byte for byte:
// Q2_K fits each 16 values with a scale and a min (weights |x|, the sum of absolute errors over 16 candidate
// grids), Q3_K with a signed scale (weights x^2, a few rounds of moving single values to better levels); the
// super-block's 4-bit (6-bit) scales are then rounded and the values re-quantized against them. With an
// importance matrix, as llama-quantize's (quantize_q2_K / q3_K given quant_weights): squared errors weighted by
// the importances, and the super-block's scales fitted by weighted search too.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/decode.h"
#include "quant/kernels.h"
#include "quant/quant_weighted.h"

// ggml rounds each product and sum on its own (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {
namespace {

// Round to nearest, ties to even (ggml's nearest_int), for |v| < 2^22.
int nearest(float v) {
    const float shifted = v + 12582912.0f;
    int32_t bits;
    std::memcpy(&bits, &shifted, 4);
    return (bits & 0x007FFFFF) - 0x00400000;
}
int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// x ~= scale * L - min_out over n <= 32 values, L in [0, nmax], min_out >= 0: the min/max grid, then nstep + 1 grids
// (nmax + rmin + rdelta k) / (max - min), each with its weighted least-squares scale and offset; the one with
// the least w-weighted error (absolute, or squared with an importance matrix) wins. Returns the scale.
struct Q2Search {
    float rmin, rdelta;
    int nstep;
    bool squared;
};
constexpr Q2Search kQ2Plain{-0.5f, 0.1f, 15, false}, kQ2Weighted{-0.9f, 0.05f, 36, true};

float fit_q2(int n, int nmax, const float* x, const float* w, uint8_t* L, float& min_out, const Q2Search& s) {
    const float rmin = s.rmin, rdelta = s.rdelta;
    const int nstep = s.nstep;
    auto error = [&](float diff) { return s.squared ? diff * diff : std::fabs(diff); };
    float mn = x[0], mx = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (mn > 0) mn = 0;
    if (mx == mn) {
        std::memset(L, 0, n);
        min_out = -mn;
        return 0.0f;
    }
    float iscale = nmax / (mx - mn), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = uint8_t(clampi(nearest(iscale * (x[i] - mn)), 0, nmax));
        best += w[i] * error(scale * L[i] + mn - x[i]);
    }
    uint8_t aux[32];
    for (int k = 0; k <= nstep; ++k) {
        iscale = (rmin + rdelta * k + nmax) / (mx - mn);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clampi(nearest(iscale * (x[i] - mn)), 0, nmax);
            aux[i] = uint8_t(l);
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; ++i) err += w[i] * error(this_scale * aux[i] + this_min - x[i]);
        if (err < best) {
            std::memcpy(L, aux, n);
            best = err;
            scale = this_scale;
            mn = this_min;
        }
    }
    min_out = -mn;
    return scale;
}

// x ~= scale * (L - 4) over 16 values, L - 4 in [-4, 3], weights x^2: levels from the value of largest
// magnitude at -4, then up to 5 rounds moving single values to the level the rest's fit calls for where
// that lowers the error. Returns the scale (L stored with its offset).
float fit_q3(const float* x, int8_t* L) {
    constexpr int n = 16, nmax = 4;
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        std::memset(L, 0, n);
        return 0.0f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = int8_t(clampi(nearest(iscale * x[i]), -nmax, nmax - 1));
        const float w = x[i] * x[i];
        sumlx += w * x[i] * L[i];
        suml2 += w * L[i] * L[i];
    }
    for (int round = 0; round < 5; ++round) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * L[i] * L[i];
            const int l = clampi(nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (l == L[i]) continue;
            slx += w * x[i] * l;
            sl2 += w * l * l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = int8_t(l);
                sumlx = slx;
                suml2 = sl2;
                ++changed;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

}  // namespace

float fit_scale_min_weighted(int n, int nmax, const float* x, const float* w, uint8_t* L, float& min_out) {
    return fit_q2(n, nmax, x, w, L, min_out, kQ2Weighted);
}

float fit_levels_upward(int n, int nmax, const float* x, uint8_t* L, const float* sw) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = x[i] > max ? x[i] : max;
    if (max < 1e-15f) {
        std::memset(L, 0, n);
        return 0.0f;
    }
    float iscale = nmax / max, best = 0;
    const float scale = 1 / iscale;
    for (int i = 0; i < n; ++i) {
        L[i] = uint8_t(nearest(iscale * x[i]));
        const float diff = x[i] - scale * L[i];
        best += sw[i] * diff * diff;
    }
    for (int k = -4; k <= 4; ++k) {
        if (k == 0) continue;
        const float iscale_k = (0.1f * k + nmax) / max, scale_k = 1 / iscale_k;
        float err = 0;
        for (int i = 0; i < n; ++i) {
            const float diff = x[i] - scale_k * std::min(nmax, nearest(iscale_k * x[i]));
            err += sw[i] * diff * diff;
        }
        if (err < best) {
            best = err;
            iscale = iscale_k;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = std::min(nmax, nearest(iscale * x[i]));
        L[i] = uint8_t(l);
        sumlx += sw[i] * x[i] * l;
        suml2 += sw[i] * l * l;
    }
    for (int round = 0; round < 5; ++round) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = sw[i];
            float slx = sumlx - w * x[i] * L[i], sl2 = suml2 - w * L[i] * L[i];
            if (!(slx > 0 && sl2 > 0)) continue;
            const int l = std::min(nmax, nearest(x[i] * sl2 / slx));
            if (l == L[i]) continue;
            slx += w * x[i] * l;
            sl2 += w * l * l;
            if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = uint8_t(l);
                sumlx = slx;
                suml2 = sl2;
                ++changed;
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

float fit_symmetric_weighted(int n, int nmax, const float* x, int8_t* L, const float* w) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i)
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    if (amax < 1e-15f) {
        std::memset(L, 0, n);
        return 0.0f;
    }
    auto fit = [&](float iscale, float& sumlx, float& suml2) {
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            sumlx += w[i] * x[i] * l;
            suml2 += w[i] * l * l;
        }
    };
    auto store = [&](float iscale) {
        for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + clampi(nearest(iscale * x[i]), -nmax, nmax - 1));
    };
    float sumlx, suml2;
    fit(-nmax / max, sumlx, suml2);
    store(-nmax / max);
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int k = -9; k <= 9; ++k) {
        if (k == 0) continue;
        const float iscale = -(nmax + 0.1f * k) / max;
        fit(iscale, sumlx, suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            store(iscale);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

namespace {

// Each element's weight under an importance matrix, as llama.cpp's K types: its column's importance times
// sqrt(sigma2 + x^2), sigma2 the super-block's mean square times spread.
void importance_weights(const float* x, const float* qw, float spread, float* w) {
    float sumx2 = 0;
    for (int j = 0; j < QK_K; ++j) sumx2 += x[j] * x[j];
    const float sigma2 = spread * sumx2 / QK_K;
    for (int j = 0; j < QK_K; ++j) w[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

// 2-bit values of 128-value halves: value 128 c + 32 s + l at bits 2 s of qs[32 c + l].
void pack_2bit(const uint8_t* L, uint8_t* qs) {
    for (int c = 0; c < 2; ++c)
        for (int l = 0; l < 32; ++l) {
            const uint8_t* v = L + 128 * c + l;
            qs[32 * c + l] = uint8_t(v[0] | v[32] << 2 | v[64] << 4 | v[96] << 6);
        }
}

// With d, dmin and the scales stored: each sub-block's values re-rounded against them (a sub-block of
// scale 0 keeps its fit's levels), then packed.
void finish_q2(const float* x, BlockQ2_K& y, uint8_t* L) {
    for (int j = 0; j < 16; ++j) {
        const float d = half_to_float(y.d) * float(y.scales[j] & 0xF);
        if (!d) continue;
        const float dm = half_to_float(y.dmin) * float(y.scales[j] >> 4);
        for (int l = 0; l < 16; ++l) L[16 * j + l] = uint8_t(clampi(nearest((x[16 * j + l] + dm) / d), 0, 3));
    }
    pack_2bit(L, y.qs);
}

// 6-bit scales l (offset 32 included): low nibble j of bytes 0-7 (j >= 8 the high nibble of byte j - 8),
// top 2 bits at 2 (j / 4) of byte 8 + j % 4.
void pack_q3_scales(const int* l, uint8_t* scales) {
    std::memset(scales, 0, 12);
    for (int j = 0; j < 16; ++j) {
        scales[j % 8] |= uint8_t((l[j] & 0xF) << (j < 8 ? 0 : 4));
        scales[8 + j % 4] |= uint8_t((l[j] >> 4) << (2 * (j / 4)));
    }
}

// With d and the scales stored: the values re-rounded against them (a sub-block of scale 0 keeps its fit's
// levels), then bit 2 of value e in bit e / 32 of hmask[e % 32], its low 2 bits as Q2_K's.
void finish_q3(const float* x, BlockQ3_K& y, int8_t* L) {
    KDecoded k;
    decode_q3_k(y, k);
    for (int j = 0; j < 16; ++j) {
        const float d = half_to_float(y.d) * float(k.sc[j]);
        if (!d) continue;
        for (int l = 0; l < 16; ++l) L[16 * j + l] = int8_t(clampi(nearest(x[16 * j + l] / d), -4, 3) + 4);
    }
    std::memset(y.hmask, 0, QK_K / 8);
    uint8_t low[QK_K];
    for (int e = 0; e < QK_K; ++e) {
        if (L[e] > 3) y.hmask[e % 32] |= uint8_t(1 << (e / 32));
        low[e] = uint8_t(L[e] & 3);
    }
    pack_2bit(low, y.qs);
}

}  // namespace

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
    BlockQ2_K* y = static_cast<BlockQ2_K*>(dst);
    uint8_t L[QK_K];
    float w[16], scales[16], mins[16];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l) w[l] = std::fabs(src[16 * j + l]);
            scales[j] = fit_q2(16, 3, src + 16 * j, w, L + 16 * j, mins[j], kQ2Plain);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        std::memset(y[i].scales, 0, 16);
        y[i].d = y[i].dmin = float_to_half(0.0f);
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < 16; ++j) y[i].scales[j] = uint8_t(nearest(iscale * scales[j]));
            y[i].d = float_to_half(max_scale / 15.f);
        }
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < 16; ++j) y[i].scales[j] |= uint8_t(nearest(iscale * mins[j]) << 4);
            y[i].dmin = float_to_half(max_min / 15.f);
        }
        finish_q2(src, y[i], L);
    }
}

void quantize_q2_k_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    BlockQ2_K* y = static_cast<BlockQ2_K*>(dst);
    uint8_t L[QK_K], Ls[16], Lm[16];
    float w[QK_K], sw[16], scales[16], mins[16];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K, qw += QK_K) {
        importance_weights(src, qw, 1.0f, w);
        for (int j = 0; j < 16; ++j) {
            sw[j] = 0;
            for (int l = 0; l < 16; ++l) sw[j] += w[16 * j + l];
            scales[j] = fit_q2(16, 3, src + 16 * j, w + 16 * j, L + 16 * j, mins[j], kQ2Weighted);
        }
        y[i].d = float_to_half(fit_levels_upward(16, 15, scales, Ls, sw));
        y[i].dmin = float_to_half(fit_levels_upward(16, 15, mins, Lm, sw));
        for (int j = 0; j < 16; ++j) y[i].scales[j] = uint8_t(Ls[j] | Lm[j] << 4);
        finish_q2(src, y[i], L);
    }
}

void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
    BlockQ3_K* y = static_cast<BlockQ3_K*>(dst);
    int8_t L[QK_K];
    float scales[16];
    int ls[16];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; ++j) {
            scales[j] = fit_q3(src + 16 * j, L + 16 * j);
            if (std::fabs(scales[j]) > amax) {
                amax = std::fabs(scales[j]);
                max_scale = scales[j];
            }
        }
        std::memset(y[i].scales, 0, 12);
        y[i].d = float_to_half(0.0f);
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; ++j) ls[j] = clampi(int8_t(nearest(iscale * scales[j])), -32, 31) + 32;
            pack_q3_scales(ls, y[i].scales);
            y[i].d = float_to_half(1 / iscale);
        }
        finish_q3(src, y[i], L);
    }
}

void quantize_q3_k_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    BlockQ3_K* y = static_cast<BlockQ3_K*>(dst);
    int8_t L[QK_K], Ls[16];
    float w[QK_K], sw[16], scales[16];
    int ls[16];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K, qw += QK_K) {
        importance_weights(src, qw, 2.0f, w);
        for (int j = 0; j < 16; ++j) {
            sw[j] = 0;
            for (int l = 0; l < 16; ++l) sw[j] += w[16 * j + l];
            scales[j] = fit_symmetric_weighted(16, 4, src + 16 * j, L + 16 * j, w + 16 * j);
        }
        const float d = fit_symmetric_weighted(16, 32, scales, Ls, sw);
        for (int j = 0; j < 16; ++j) ls[j] = Ls[j];
        pack_q3_scales(ls, y[i].scales);
        y[i].d = float_to_half(d);
        finish_q3(src, y[i], L);
    }
}

}  // namespace ember
