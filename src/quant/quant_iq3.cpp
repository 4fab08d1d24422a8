// IQ3_XXS's and IQ3_S's quantizers as ggml's (quantize_iq3_xxs / iq3_s, what llama-quantize writes, with or
// without an importance matrix): per sub-block of 32, signs split off, a search over candidate scales where
// each 4 magnitudes go to their grid point or, off the grid, to the best of its nearest grid points; then the
// sub-block scales as 4-bit steps of the super-block's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant/decode.h"
#include "quant/kernels.h"
#include "quant/quant_grid_search.h"
#include "quant/quant_weighted.h"

// ggml rounds each product and sum on its own (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {
namespace {

constexpr int kMaxQ = 8;   // magnitudes 2 l + 1, l in [0, 7]

using Iq3Grid = GridSearch<4, 3>;

int xxs_level(int v) { return (v - 4) / 8; }   // IQ3_XXS's values 4, 12, ..., 52, 62
int s_level(int v) { return (v - 1) / 2; }     // IQ3_S's odd values 1 .. 15

const Iq3Grid& xxs_grid() {
    static const Iq3Grid g(iq3xxs_grid.v, 256, 2, xxs_level, kMaxQ - 1);
    return g;
}
const Iq3Grid& s_grid() {
    static const Iq3Grid g(iq3s_grid.v, 512, 3, s_level, kMaxQ - 1);
    return g;
}

// How the two types differ in their sub-block search.
struct Iq3Kind {
    const Iq3Grid& grid;
    int n_scales;          // candidate scales (2 kMaxQ - 1 + 0.2 k) / max, k in [-n_scales, n_scales]
    bool even_signs;       // IQ3_XXS stores 7 sign bits per 8 values: an even count of negatives
    bool refit_on_grid;    // the refit after the search moves the points found on the grid too
};

// One sub-block of 32: x's magnitudes (signs in sign bytes, one per 8) to the grid levels L, and its scale;
// false for a zero sub-block (IQ3_XXS: largest magnitude below 1e-8), which is not stored.
bool fit_sub_block(const Iq3Kind& kind, const float* x, const float* weight, int8_t* L, uint8_t* signs, float& scale) {
    float xval[32], waux[32];
    for (int i = 0; i < 32; ++i) waux[i] = std::sqrt(weight[i]);
    for (int k = 0; k < 4; ++k) {
        int n_neg = 0;
        uint8_t s = 0;
        for (int i = 0; i < 8; ++i) {
            const float v = x[8 * k + i];
            xval[8 * k + i] = v >= 0 ? v : -v;
            if (v < 0) {
                ++n_neg;
                s |= uint8_t(1 << i);
            }
        }
        if (kind.even_signs && n_neg % 2) {
            // the value whose flip costs the least weighted error keeps the wrong sign
            int imin = 0;
            float min = weight[8 * k] * x[8 * k] * x[8 * k];
            for (int i = 1; i < 8; ++i) {
                const float ax = weight[8 * k + i] * x[8 * k + i] * x[8 * k + i];
                if (ax < min) {
                    min = ax;
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= uint8_t(1 << imin);
        }
        signs[k] = s;
    }
    float max = xval[0];
    for (int i = 1; i < 32; ++i) max = std::max(max, xval[i]);
    std::memset(L, 0, 32);
    scale = 0.0f;
    if (kind.even_signs ? max < 1e-8f : max == 0.0f) return false;
    auto fit = [&](const int8_t* l, float& sumqx, float& sumq2) {
        sumqx = sumq2 = 0;
        for (int i = 0; i < 32; ++i) {
            const float q = float(2 * l[i] + 1);
            sumqx += weight[i] * xval[i] * q;
            sumq2 += weight[i] * q * q;
        }
    };
    float best = 0;
    scale = max / (2 * kMaxQ - 1);
    bool on_grid[8], on_grid_aux[8];
    std::fill(on_grid, on_grid + 8, kind.even_signs);
    int8_t Laux[32];
    for (int is = -kind.n_scales; is <= kind.n_scales; ++is) {
        const float id = (2 * kMaxQ - 1 + is * 0.2f) / max, this_scale = 1 / id;
        for (int k = 0; k < 8; ++k)
            on_grid_aux[k] = kind.grid.place(Laux + 4 * k, xval + 4 * k, waux + 4 * k, id, this_scale);
        float sumqx, sumq2;
        fit(Laux, sumqx, sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            std::memcpy(L, Laux, 32);
            std::copy(on_grid_aux, on_grid_aux + 8, on_grid);
        }
    }
    if (scale > 0 && std::count(on_grid, on_grid + 8, false) > 0) {
        const float id = 1 / scale;
        for (int k = 0; k < 8; ++k)
            if (kind.refit_on_grid || !on_grid[k]) kind.grid.place(L + 4 * k, xval + 4 * k, waux + 4 * k, id, scale);
        float sumqx, sumq2;
        fit(L, sumqx, sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    if (scale < 0) {   // cannot happen with weights >= 0; the sign bits take the flip as ggml's do
        scale = -scale;
        for (int k = 0; k < 4; ++k) signs[k] = uint8_t(~signs[k]);
    }
    return true;
}

// Per element: x^2, or with importances the importance times sqrt(sigma2 + x^2), sigma2 twice the super-block's
// mean square.
void element_weights(const float* x, const float* qw, float* w) {
    float sumx2 = 0;
    for (int i = 0; i < QK_K; ++i) sumx2 += x[i] * x[i];
    const float sigma2 = 2 * sumx2 / QK_K;
    for (int i = 0; i < QK_K; ++i) w[i] = qw ? qw[i] * std::sqrt(sigma2 + x[i] * x[i]) : x[i] * x[i];
}

// The 4-bit step l of a sub-block's scale under the super-block's d: scale ~= d (2 l + 1).
int scale_step(float scale, float id) { return std::clamp(nearest_even(0.5f * (id * scale - 1)), 0, 15); }

}  // namespace

void quantize_iq3_xxs_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    const Iq3Kind kind{xxs_grid(), 15, true, false};
    BlockIQ3_XXS* y = static_cast<BlockIQ3_XXS*>(dst);
    float w[QK_K], scales[8];
    int8_t L[32];
    uint8_t signs[4];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, src += QK_K) {
        element_weights(src, qw ? qw + ib * QK_K : nullptr, w);
        uint8_t q3[3 * QK_K / 8] = {};
        uint8_t* words = q3 + QK_K / 4;
        float max_scale = 0;
        for (int j = 0; j < 8; ++j) {
            if (!fit_sub_block(kind, src + 32 * j, w + 32 * j, L, signs, scales[j])) continue;
            for (int k = 0; k < 8; ++k) q3[8 * j + k] = uint8_t(kind.grid.index(L + 4 * k));
            const uint32_t word = uint32_t(signs[0] & 127) | uint32_t(signs[1] & 127) << 7 |
                                  uint32_t(signs[2] & 127) << 14 | uint32_t(signs[3] & 127) << 21;
            std::memcpy(words + 4 * j, &word, 4);
            max_scale = std::max(max_scale, scales[j]);
        }
        y[ib].d = float_to_half(0.0f);
        if (!max_scale) {
            std::memset(y[ib].qs, 0, sizeof y[ib].qs);
            continue;
        }
        const float d = max_scale / 31;
        y[ib].d = float_to_half(d * 1.0125f);   // ggml's fudge factor on the stored step
        for (int j = 0; j < 8; ++j) {
            uint32_t word;
            std::memcpy(&word, words + 4 * j, 4);
            word |= uint32_t(scale_step(scales[j], 1 / d)) << 28;
            std::memcpy(words + 4 * j, &word, 4);
        }
        std::memcpy(y[ib].qs, q3, sizeof q3);
    }
}

void quantize_iq3_s_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    const Iq3Kind kind{s_grid(), 9, false, true};
    BlockIQ3_S* y = static_cast<BlockIQ3_S*>(dst);
    float w[QK_K], scales[8];
    int8_t L[32];
    uint8_t signs[4];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, src += QK_K) {
        std::memset(&y[ib], 0, sizeof(BlockIQ3_S));
        element_weights(src, qw ? qw + ib * QK_K : nullptr, w);
        // ggml moves on in qs and signs only past a sub-block it stored: after a zero sub-block the later
        // ones sit a sub-block early (qh and the scales keep their places)
        uint8_t* qs = y[ib].qs;
        uint8_t* sg = y[ib].signs;
        float max_scale = 0;
        for (int j = 0; j < 8; ++j) {
            if (!fit_sub_block(kind, src + 32 * j, w + 32 * j, L, signs, scales[j])) continue;
            for (int k = 0; k < 8; ++k) {
                const int g = kind.grid.index(L + 4 * k);
                qs[k] = uint8_t(g & 255);
                y[ib].qh[(8 * j + k) / 8] |= uint8_t((g >> 8) << ((8 * j + k) % 8));
            }
            qs += 8;
            std::memcpy(sg, signs, 4);
            sg += 4;
            max_scale = std::max(max_scale, scales[j]);
        }
        if (!max_scale) continue;
        const float d = max_scale / 31;
        y[ib].d = float_to_half(d * 1.033f);   // ggml's fudge factor on the stored step
        for (int j = 0; j < 8; j += 2)
            y[ib].scales[j / 2] = uint8_t(scale_step(scales[j], 1 / d) | scale_step(scales[j + 1], 1 / d) << 4);
    }
}

}  // namespace ember
