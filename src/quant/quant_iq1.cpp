// IQ1_S's and IQ1_M's quantizers as ggml's (quantize_iq1_s / quantize_iq1_m, what llama-quantize writes; IQ1_S
// needs an importance matrix): per sub-block (32 values, 16 for IQ1_M) the exact weighted least-squares split of the
// sorted values into levels -1, 0, 1 shifted by +-1/8, each 8 levels then to their grid point or, off the grid, the
// best of its nearest ones; then the sub-block scales as 3-bit steps of the super-block's.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>

#include "ember/status.h"
#include "quant/decode.h"
#include "quant/quant_grid_search.h"
#include "quant/quant_weighted.h"

// ggml rounds each product and sum on its own (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {
namespace {

// The levels 0, 1, 2 (values -1, 0, 1) with the sub-block's shift up (+1/8) or down (-1/8).
constexpr float kDelta = 0.125f;
constexpr float kUp[3] = {-1 + kDelta, kDelta, 1 + kDelta};
constexpr float kDown[3] = {-1 - kDelta, -kDelta, 1 - kDelta};

using Iq1Grid = GridSearch<8, 2>;

int iq1_level(int v) { return (v + 1) & 0xFF; }   // the grid's bytes -1, 0, 1

const Iq1Grid& grid() {
    static const Iq1Grid g(iq1s_grid.v, 2048, 3, iq1_level, 2);
    return g;
}

// The grid index of the 8 levels L, or off the grid (on_grid then cleared) the neighbour of least w-weighted
// squared error against x with the levels valued `values` times scale.
uint16_t grid_point(const int8_t* L, const float* x, const float* w, float scale, const float* values, bool& on_grid) {
    const Iq1Grid& g = grid();
    if (const int at = g.index(L); at >= 0) return uint16_t(at);
    on_grid = false;
    const std::vector<uint16_t>& near = g.neighbours(L);
    float best = FLT_MAX;
    int at = -1;
    for (const uint16_t j : near) {
        const int8_t* p = g.point(j);
        float d2 = 0;
        for (int i = 0; i < 8; ++i) {
            const float diff = scale * values[(p[i] - 1) / 2] - x[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) {
            best = d2;
            at = j;
        }
    }
    return uint16_t(at >= 0 ? at : near[0]);   // every error overflowed (values near float's limit): the nearest
}

// The n values' order ascending; equal values keep their order, as the merge sort ggml's qsort runs does.
void ascending(const float* x, int n, int* order) {
    std::iota(order, order + n, 0);
    std::stable_sort(order, order + n, [x](int a, int b) { return x[a] < x[b]; });
}

// Level 0 for the values before position i1 in the order, 1 up to i2, 2 from there.
void split_levels(const int* order, int n, int i1, int i2, int8_t* L) {
    for (int j = 0; j < n; ++j) L[order[j]] = int8_t(j < i1 ? 0 : j < i2 ? 1 : 2);
}

// The w-weighted least-squares scale of the grid points index (values_of(k) the level values of group k) against x,
// where it is positive.
template <class Values>
void refit(const float* x, const float* w, const uint16_t* index, int groups, Values values_of, float& scale) {
    float sumqx = 0, sumq2 = 0;
    for (int k = 0; k < groups; ++k) {
        const int8_t* p = grid().point(index[k]);
        const float* values = values_of(k);
        for (int j = 0; j < 8; ++j) {
            const float q = values[(p[j] - 1) / 2];
            sumqx += w[8 * k + j] * q * x[8 * k + j];
            sumq2 += w[8 * k + j] * q * q;
        }
    }
    if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
}

float abs_max(const float* x, int n) {
    float max = std::fabs(x[0]);
    for (int i = 1; i < n; ++i) max = std::max(max, std::fabs(x[i]));
    return max;
}

// Per element: the importance times sqrt(sigma2 + x^2), sigma2 twice the super-block's mean square; without
// importances x^2.
void element_weights(const float* x, const float* qw, float* w) {
    float sumx2 = 0;
    for (int i = 0; i < QK_K; ++i) sumx2 += x[i] * x[i];
    const float sigma2 = 2 * sumx2 / QK_K;
    for (int i = 0; i < QK_K; ++i) w[i] = qw ? qw[i] * std::sqrt(sigma2 + x[i] * x[i]) : x[i] * x[i];
}

// The 3-bit step l of a sub-block's scale under the super-block's d: scale ~= d (2 l + 1).
int scale_step(float scale, float id) { return std::clamp(nearest_even(0.5f * (id * scale - 1)), 0, 7); }

// One IQ1_S sub-block of 32: its 4 grid points, scale and shift (1 up, -1 down); false stores it as zero.
bool fit_iq1_s(const float* x, const float* w, uint16_t* index, float& scale, int& shift) {
    constexpr int n = 32;
    const float max = abs_max(x, n);
    if (max < 1e-12f) return false;
    int order[n];
    ascending(x, n, order);
    float sumx[n + 1], sumw[n + 1];
    sumx[0] = sumw[0] = 0;
    for (int j = 0; j < n; ++j) {
        sumx[j + 1] = sumx[j] + w[order[j]] * x[order[j]];
        sumw[j + 1] = sumw[j] + w[order[j]];
    }
    float best = -FLT_MAX;
    int b1 = -1, b2 = -1;
    scale = max;
    shift = 0;
    for (int i1 = 0; i1 <= n; ++i1)
        for (int i2 = i1; i2 <= n; ++i2)
            for (const int s : {1, -1}) {
                const float* v = s == 1 ? kUp : kDown;
                const float sumqx = (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] +
                                    (sumx[n] - sumx[i2]) * v[2];
                const float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] + (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                                    (sumw[n] - sumw[i2]) * v[2] * v[2];
                if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                    scale = sumqx / sumq2;
                    best = scale * sumqx;
                    b1 = i1;
                    b2 = i2;
                    shift = s;
                }
            }
    if (b1 < 0) return false;
    int8_t L[n];
    split_levels(order, n, b1, b2, L);
    if (scale < 0) {
        for (int j = 0; j < n; ++j) L[j] = int8_t(2 - L[j]);
        scale = -scale;
        shift = -shift;
    }
    const float* v = shift == 1 ? kUp : kDown;
    bool on_grid = true;
    for (int k = 0; k < n / 8; ++k) index[k] = grid_point(L + 8 * k, x + 8 * k, w + 8 * k, scale, v, on_grid);
    if (!on_grid) refit(x, w, index, n / 8, [v](int) { return v; }, scale);
    return true;
}

// IQ1_M's shifts per sub-block of 16: bit 1 the first 8 values' (set: down), bit 0 the last 8's.
const float* half_values(int shifts, int half) { return (half == 0 ? shifts >> 1 : shifts & 1) ? kDown : kUp; }

// One IQ1_M sub-block of 16: its 2 grid points, scale and shifts; false stores it as zero.
bool fit_iq1_m(const float* x, const float* w, uint16_t* index, float& scale, int& shifts) {
    constexpr int n = 16;
    const float max = abs_max(x, n);
    if (max < 1e-7f) return false;
    int order[n];
    ascending(x, n, order);
    // prefix sums per half, each half's values shifted on their own: the split's sums are then T v2 - S(i1) - S(i2)
    float px[2][n + 1], pw[2][n + 1];
    px[0][0] = px[1][0] = pw[0][0] = pw[1][0] = 0;
    for (int j = 0; j < n; ++j) {
        const int i = order[j], h = i < n / 2 ? 0 : 1;
        px[h][j + 1] = px[h][j] + w[i] * x[i];
        px[1 - h][j + 1] = px[1 - h][j];
        pw[h][j + 1] = pw[h][j] + w[i];
        pw[1 - h][j + 1] = pw[1 - h][j];
    }
    const float txs[2] = {px[0][n], px[1][n]}, tws[2] = {pw[0][n], pw[1][n]};
    const float p2 = kUp[2], m2 = kDown[2];
    const float cp1 = kUp[0] * kUp[0] - kUp[1] * kUp[1], cp2 = kUp[1] * kUp[1] - kUp[2] * kUp[2];
    const float cm1 = kDown[0] * kDown[0] - kDown[1] * kDown[1], cm2 = kDown[1] * kDown[1] - kDown[2] * kDown[2];
    float best = -FLT_MAX;
    int b1 = -1, b2 = -1;
    scale = max;
    shifts = -1;
    for (int i1 = 0; i1 <= n; ++i1)
        for (int i2 = i1; i2 <= n; ++i2) {
            float qx_p[2], qx_m[2], q2_p[2], q2_m[2];
            for (int h = 0; h < 2; ++h) {
                const float sx = px[h][i1] + px[h][i2];
                qx_p[h] = txs[h] * p2 - sx;
                qx_m[h] = txs[h] * m2 - sx;
                q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
            }
            const float sumqx[4] = {qx_p[0] + qx_p[1], qx_p[0] + qx_m[1], qx_m[0] + qx_p[1], qx_m[0] + qx_m[1]};
            const float sumq2[4] = {q2_p[0] + q2_p[1], q2_p[0] + q2_m[1], q2_m[0] + q2_p[1], q2_m[0] + q2_m[1]};
            for (int k = 0; k < 4; ++k)
                if (sumq2[k] > 0 && sumqx[k] * sumqx[k] > best * sumq2[k]) {
                    scale = sumqx[k] / sumq2[k];
                    best = scale * sumqx[k];
                    b1 = i1;
                    b2 = i2;
                    shifts = k;
                }
        }
    if (b1 < 0) return false;
    int8_t L[n];
    split_levels(order, n, b1, b2, L);
    if (scale < 0) {
        for (int j = 0; j < n; ++j) L[j] = int8_t(2 - L[j]);
        scale = -scale;
        shifts = 3 - shifts;
    }
    bool on_grid = true;
    for (int k = 0; k < 2; ++k)
        index[k] = grid_point(L + 8 * k, x + 8 * k, w + 8 * k, scale, half_values(shifts, k), on_grid);
    if (!on_grid) refit(x, w, index, 2, [shifts](int k) { return half_values(shifts, k); }, scale);
    return true;
}

}  // namespace

void quantize_iq1_s_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    if (!qw) fail("IQ1_S: quantizing needs importances (an importance matrix entry for the tensor)");
    BlockIQ1_S* y = static_cast<BlockIQ1_S*>(dst);
    float w[QK_K], scales[8];
    int shifts[8];
    uint16_t index[4];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, src += QK_K, qw += QK_K) {
        std::memset(&y[ib], 0, sizeof(BlockIQ1_S));
        element_weights(src, qw, w);
        float max_scale = 0;
        for (int j = 0; j < 8; ++j) {
            if (!fit_iq1_s(src + 32 * j, w + 32 * j, index, scales[j], shifts[j])) {
                scales[j] = 0;
                shifts[j] = 1;
                continue;
            }
            for (int k = 0; k < 4; ++k) {
                y[ib].qs[4 * j + k] = uint8_t(index[k] & 255);
                y[ib].qh[j] |= uint16_t((index[k] >> 8) << (3 * k));
            }
            max_scale = std::max(max_scale, scales[j]);
        }
        if (!max_scale) continue;
        const float d = max_scale / 15;
        y[ib].d = float_to_half(d * 1.125f);   // ggml's fudge factor on the stored step
        const float id = 1 / d;
        for (int j = 0; j < 8; ++j)
            y[ib].qh[j] |= uint16_t((scale_step(scales[j], id) | (shifts[j] == -1 ? 8 : 0)) << 12);
    }
}

void quantize_iq1_m_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    static constexpr uint8_t kShiftBits[4] = {0x00, 0x80, 0x08, 0x88};
    BlockIQ1_M* y = static_cast<BlockIQ1_M*>(dst);
    float w[QK_K], scales[16];
    int shifts[16];
    uint16_t index[16][2];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, src += QK_K) {
        std::memset(&y[ib], 0, sizeof(BlockIQ1_M));
        element_weights(src, qw ? qw + ib * QK_K : nullptr, w);
        float max_scale = 0;
        for (int j = 0; j < 16; ++j) {
            if (!fit_iq1_m(src + 16 * j, w + 16 * j, index[j], scales[j], shifts[j])) {
                scales[j] = 0;
                shifts[j] = 0;
                index[j][0] = index[j][1] = 0;
                continue;
            }
            y[ib].qs[2 * j] = uint8_t(index[j][0] & 255);
            y[ib].qs[2 * j + 1] = uint8_t(index[j][1] & 255);
            y[ib].qh[j] = uint8_t((index[j][0] >> 8) | ((index[j][1] >> 8) << 4));
            max_scale = std::max(max_scale, scales[j]);
        }
        if (!max_scale) continue;
        // the steps from the largest scale, then the super-block's d refitted to the rounded steps over every value
        uint16_t sc[4] = {};
        float d = max_scale / 15;
        const float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 16; ++j) {
            const int l = scale_step(scales[j], id);
            sc[j / 4] |= uint16_t(l << (3 * (j % 4)));
            y[ib].qh[j] |= kShiftBits[shifts[j]];
            for (int k = 0; k < 2; ++k) {
                const int8_t* p = grid().point(index[j][k]);
                const float* values = half_values(shifts[j], k);
                for (int i = 0; i < 8; ++i) {
                    const float q = values[(p[i] - 1) / 2] * float(2 * l + 1);
                    sumqx += w[16 * j + 8 * k + i] * q * src[16 * j + 8 * k + i];
                    sumq2 += w[16 * j + 8 * k + i] * q * q;
                }
            }
        }
        if (sumq2 > 0) d = sumqx / sumq2;
        const uint16_t h = float_to_half(d * 1.1125f);   // ggml's fudge factor
        sc[0] |= uint16_t((h & 0x000f) << 12);
        sc[1] |= uint16_t((h & 0x00f0) << 8);
        sc[2] |= uint16_t((h & 0x0f00) << 4);
        sc[3] |= uint16_t(h & 0xf000);
        std::memcpy(y[ib].scales, sc, sizeof sc);
    }
}

}  // namespace ember
