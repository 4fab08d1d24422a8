// IQ2_XXS's, IQ2_XS's and IQ2_S's quantizers as ggml's (quantize_iq2_xxs / iq2_xs / iq2_s, what llama-quantize
// writes; the first two need an importance matrix): per sub-block (32 values, 16 for IQ2_XS and IQ2_S) the signs
// split off (IQ2_XXS / IQ2_XS: an even count a group of 8), a search over candidate scales where each 8 magnitudes
// go to their grid point or, off the grid, to the best of its nearest grid points; then the sub-block scales as
// 4-bit steps of the super-block's.
#include <algorithm>
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

constexpr int kMaxQ = 3;   // magnitudes 2 l + 1, l in [0, 2]

using Iq2Grid = GridSearch<8, 2>;

int iq2_level(int v) { return (v - 8) / 17; }   // the decoders' values 8, 25, 43

const Iq2Grid& xxs_grid() {
    static const Iq2Grid g(iq2xxs_grid.v, 256, 2, iq2_level, kMaxQ - 1);
    return g;
}
const Iq2Grid& xs_grid() {
    static const Iq2Grid g(iq2xs_grid.v, 512, 2, iq2_level, kMaxQ - 1);
    return g;
}
const Iq2Grid& s_grid() {
    static const Iq2Grid g(iq2s_grid.v, 1024, 1, iq2_level, kMaxQ - 1);
    return g;
}

// How the two types differ in their sub-block search.
struct Iq2Kind {
    const Iq2Grid& grid;
    int n;                // values a sub-block
    bool qp_start;        // IQ2_XXS: the candidate scales around a least-squares fit of levels 0..3, not the max
    int n_scales;         // candidates (2 kMaxQ - 1 + 0.1 k) / max, k in [-n_scales, n_scales]
    bool refit_on_grid;   // the refit after the search moves the groups found on the grid too
    bool even_signs;      // 7 sign bits a group of 8 (an even count of negatives)
    float min_max;        // a sub-block whose largest magnitude is below this is stored as zero
};

// One sub-block: x's magnitudes (signs in 7-bit sign bytes, one per 8; an even count of negatives, the value whose
// flip costs least keeping a wrong sign) to the grid levels L, and its scale; false for a zero sub-block.
bool fit_sub_block(const Iq2Kind& kind, const float* x, const float* weight, int8_t* L, uint8_t* signs, float& scale) {
    const int n = kind.n;
    float xval[32], waux[32];
    for (int i = 0; i < n; ++i) waux[i] = std::sqrt(weight[i]);
    for (int k = 0; k < n / 8; ++k) {
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
        signs[k] = kind.even_signs ? s & 127 : s;
    }
    float max = xval[0];
    for (int i = 1; i < n; ++i) max = std::max(max, xval[i]);
    std::memset(L, 0, n);
    scale = 0.0f;
    if (max < kind.min_max) return false;
    if (kind.qp_start) {
        uint8_t Lqp[32];
        scale = fit_levels_upward(n, kMaxQ + 1, xval, Lqp, weight);
        max = scale * kMaxQ;
        if (max <= 0) {
            scale = 0.0f;
            return false;
        }
    } else {
        scale = max / (2 * kMaxQ - 1);
    }
    auto fit = [&](const int8_t* l, float& sumqx, float& sumq2) {
        sumqx = sumq2 = 0;
        for (int i = 0; i < n; ++i) {
            const float q = float(2 * l[i] + 1);
            sumqx += weight[i] * xval[i] * q;
            sumq2 += weight[i] * q * q;
        }
    };
    float best = 0;
    bool on_grid[4] = {true, true, true, true}, on_grid_aux[4];
    int8_t Laux[32];
    for (int is = -kind.n_scales; is <= kind.n_scales; ++is) {
        const float id = (2 * kMaxQ - 1 + is * 0.1f) / max, this_scale = 1 / id;
        for (int k = 0; k < n / 8; ++k)
            on_grid_aux[k] = kind.grid.place(Laux + 8 * k, xval + 8 * k, waux + 8 * k, id, this_scale);
        float sumqx, sumq2;
        fit(Laux, sumqx, sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            std::memcpy(L, Laux, n);
            std::copy(on_grid_aux, on_grid_aux + n / 8, on_grid);
        }
    }
    if (scale > 0 && (kind.refit_on_grid || std::count(on_grid, on_grid + n / 8, false) > 0)) {
        const float id = 1 / scale;
        for (int k = 0; k < n / 8; ++k)
            if (kind.refit_on_grid || !on_grid[k]) kind.grid.place(L + 8 * k, xval + 8 * k, waux + 8 * k, id, scale);
        float sumqx, sumq2;
        fit(L, sumqx, sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    if (scale < 0) {   // cannot happen with weights >= 0; the sign bits take the flip as ggml's do
        scale = -scale;
        for (int k = 0; k < n / 8; ++k) signs[k] = uint8_t(~signs[k] & (kind.even_signs ? 127 : 255));
    }
    return true;
}

// Per element: the importance times sqrt(sigma2 + x^2), sigma2 the super-block's mean square times spread;
// without importances (IQ2_S) sigma2 / 4 + x^2.
void element_weights(const float* x, const float* qw, float spread, float* w) {
    float sumx2 = 0;
    for (int i = 0; i < QK_K; ++i) sumx2 += x[i] * x[i];
    const float sigma2 = spread * sumx2 / QK_K;
    for (int i = 0; i < QK_K; ++i) w[i] = qw ? qw[i] * std::sqrt(sigma2 + x[i] * x[i]) : 0.25f * sigma2 + x[i] * x[i];
}

// The 4-bit step l of a sub-block's scale under the super-block's d: scale ~= d (2 l + 1).
int scale_step(float scale, float id) { return std::clamp(nearest_even(0.5f * (id * scale - 1)), 0, 15); }

}  // namespace

void quantize_iq2_xxs_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    const Iq2Kind kind{xxs_grid(), 32, true, 6, true, true, 1e-15f};
    BlockIQ2_XXS* y = static_cast<BlockIQ2_XXS*>(dst);
    float w[QK_K], scales[8];
    int8_t L[32];
    uint8_t signs[4];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, src += QK_K, qw += QK_K) {
        element_weights(src, qw, 1.0f, w);
        uint32_t q2[16] = {};
        float max_scale = 0;
        for (int j = 0; j < 8; ++j) {
            if (!fit_sub_block(kind, src + 32 * j, w + 32 * j, L, signs, scales[j])) continue;
            for (int k = 0; k < 4; ++k) {
                q2[2 * j] |= uint32_t(kind.grid.index(L + 8 * k)) << (8 * k);
                q2[2 * j + 1] |= uint32_t(signs[k]) << (7 * k);
            }
            max_scale = std::max(max_scale, scales[j]);
        }
        y[ib].d = float_to_half(0.0f);
        if (!max_scale) {
            std::memset(y[ib].qs, 0, sizeof y[ib].qs);
            continue;
        }
        const float d = max_scale / 31;
        y[ib].d = float_to_half(d);
        for (int j = 0; j < 8; ++j) q2[2 * j + 1] |= uint32_t(scale_step(scales[j], 1 / d)) << 28;
        std::memcpy(y[ib].qs, q2, sizeof q2);
    }
}

void quantize_iq2_xs_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    const Iq2Kind kind{xs_grid(), 16, false, 9, false, true, 1e-15f};
    BlockIQ2_XS* y = static_cast<BlockIQ2_XS*>(dst);
    float w[QK_K], scales[16];
    int8_t L[16];
    uint8_t signs[2];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, src += QK_K, qw += QK_K) {
        element_weights(src, qw, 1.0f, w);
        uint16_t q2[32] = {};
        std::memset(y[ib].scales, 0, sizeof y[ib].scales);
        float max_scale = 0;
        for (int j = 0; j < 16; ++j) {
            if (!fit_sub_block(kind, src + 16 * j, w + 16 * j, L, signs, scales[j])) continue;
            for (int k = 0; k < 2; ++k) q2[2 * j + k] = uint16_t(kind.grid.index(L + 8 * k) | signs[k] << 9);
            max_scale = std::max(max_scale, scales[j]);
        }
        y[ib].d = float_to_half(0.0f);
        if (!max_scale) {
            std::memset(y[ib].qs, 0, sizeof y[ib].qs);
            continue;
        }
        const float d = max_scale / 31;
        y[ib].d = float_to_half(d);
        for (int j = 0; j < 16; ++j) y[ib].scales[j / 2] |= uint8_t(scale_step(scales[j], 1 / d) << (4 * (j % 2)));
        std::memcpy(y[ib].qs, q2, sizeof q2);
    }
}

void quantize_iq2_s_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    const Iq2Kind kind{s_grid(), 16, false, 9, false, false, 1e-8f};
    BlockIQ2_S* y = static_cast<BlockIQ2_S*>(dst);
    float w[QK_K], scales[16];
    int8_t L[16];
    uint8_t signs[2];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, src += QK_K) {
        std::memset(&y[ib], 0, sizeof(BlockIQ2_S));
        element_weights(src, qw ? qw + ib * QK_K : nullptr, 2.0f, w);
        float max_scale = 0;
        for (int j = 0; j < 16; ++j) {
            if (!fit_sub_block(kind, src + 16 * j, w + 16 * j, L, signs, scales[j])) continue;
            for (int k = 0; k < 2; ++k) {
                const int g = kind.grid.index(L + 8 * k), l = 2 * j + k;
                y[ib].qs[l] = uint8_t(g & 255);
                y[ib].qh[l / 4] |= uint8_t((g >> 8) << (2 * (l % 4)));
                y[ib].signs[l] = signs[k];
            }
            max_scale = std::max(max_scale, scales[j]);
        }
        if (!max_scale) continue;
        const float d = max_scale / 31;
        y[ib].d = float_to_half(d * 0.9875f);   // ggml's fudge factor on the stored step
        for (int j = 0; j < 16; ++j) y[ib].scales[j / 2] |= uint8_t(scale_step(scales[j], 1 / d) << (4 * (j % 2)));
    }
}

}  // namespace ember
