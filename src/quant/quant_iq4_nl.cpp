// IQ4_NL's quantizer as ggml's reference (quantize_row_iq4_nl_ref, which its iq4_nl KV cache stores
// with): per block of 32, d from the value of largest magnitude over the table's first level, each
// value to its nearest level, then the weighted least-squares d of those levels (weights x^2). IQ4_XS's
// as ggml's (llama-quantize's without an importance matrix): each sub-block's d the best of 16 such
// fits, then a 6-bit scale a sub-block under the super-block's d and the values re-fitted to it. With an
// importance matrix (llama-quantize's quantize_iq4_xs / iq4_nl given quant_weights) the fits' weights are
// the importances times sqrt(sigma2 + x^2) instead of x^2.
#include <cmath>
#include <cstring>

#include "quant/decode.h"
#include "quant/kernels.h"
#include "quant/quant_weighted.h"

// ggml rounds each product and sum on its own (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {
namespace {

// The index of the level of kvalues_iq4nl nearest x; a tie goes to the upper level.
int nearest_level(float x) {
    const int8_t* v = kvalues_iq4nl;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid]) hi = mid;
        else lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

// The first value of largest magnitude of n.
float signed_max(const float* x, int n, float& amax) {
    float max = 0.0f;
    amax = 0.0f;
    for (int j = 0; j < n; ++j)
        if (std::fabs(x[j]) > amax) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    return max;
}

// The w-weighted least-squares fit of 32 values to the levels nearest id * x: sum q x w, sum q^2 w.
void fit_levels(const float* x, const float* w, float id, float& sumqx, float& sumq2) {
    sumqx = sumq2 = 0.0f;
    for (int j = 0; j < QK4_0; ++j) {
        const float q = float(kvalues_iq4nl[nearest_level(id * x[j])]);
        sumqx += w[j] * q * x[j];
        sumq2 += w[j] * q * q;
    }
}

// The best d of a block of 32 under weights w: the fit of the value of largest magnitude at the table's first
// level, then the 15 fits with that value at (first level + t) for t in [-7, 7]. 0 for a block below 1e-15.
float search_scale(const float* x, const float* w) {
    float amax;
    const float max = signed_max(x, QK4_0, amax);
    if (amax < 1e-15f) return 0.0f;
    float sumqx, sumq2;
    fit_levels(x, w, 1 / (-max / float(kvalues_iq4nl[0])), sumqx, sumq2);
    float d = sumq2 > 0 ? sumqx / sumq2 : 0.0f, best = d * sumqx;
    for (int t = -7; t <= 7; ++t) {
        fit_levels(x, w, float(t + kvalues_iq4nl[0]) / max, sumqx, sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

// Each element's weight: x^2, or with an importance matrix (qw: the block's columns' importances) as
// llama-quantize's, the importance times sqrt(sigma2 + x^2), sigma2 twice the mean square over the n values
// of the (super-)block.
void element_weights(const float* x, int n, const float* qw, float* w) {
    if (!qw) {
        for (int j = 0; j < n; ++j) w[j] = x[j] * x[j];
        return;
    }
    float sigma2 = 0;
    for (int j = 0; j < n; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / float(n);
    for (int j = 0; j < n; ++j) w[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

// Packs 32 levels: value j in the low nibble of byte j, value j + 16 in its high nibble.
void pack_levels(const float* x, float id, uint8_t* qs) {
    uint8_t level[QK4_0];
    for (int j = 0; j < QK4_0; ++j) level[j] = uint8_t(nearest_level(id * x[j]));
    for (int j = 0; j < 16; ++j) qs[j] = uint8_t(level[j] | level[j + 16] << 4);
}

void quantize_iq4_xs(const float* src, void* dst, int64_t n, const float* qw) {
    BlockIQ4_XS* b = static_cast<BlockIQ4_XS*>(dst);
    float w[QK_K];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        element_weights(src, QK_K, qw ? qw + i * QK_K : nullptr, w);
        float scales[8], max_scale = 0.0f, amax_scale = 0.0f;
        for (int ib = 0; ib < 8; ++ib) {
            scales[ib] = search_scale(src + 32 * ib, w + 32 * ib);
            if (std::fabs(scales[ib]) > amax_scale) {
                amax_scale = std::fabs(scales[ib]);
                max_scale = scales[ib];
            }
        }
        const float d = -max_scale / 32, id = d != 0.0f ? 1 / d : 0.0f;
        b[i].d = float_to_half(d);
        b[i].scales_h = 0;
        std::memset(b[i].scales_l, 0, sizeof b[i].scales_l);
        for (int ib = 0; ib < 8; ++ib) {
            int l = int(std::nearbyint(id * scales[ib]));
            l = l < -32 ? -32 : (l > 31 ? 31 : l);
            const float dl = d * float(l);
            pack_levels(src + 32 * ib, dl != 0.0f ? 1 / dl : 0.0f, b[i].qs + 16 * ib);
            l += 32;
            b[i].scales_l[ib / 2] |= uint8_t((l & 0xF) << (4 * (ib % 2)));
            b[i].scales_h |= uint16_t((l >> 4) << (2 * ib));
        }
    }
}

void quantize_iq4_nl_search(const float* src, void* dst, int64_t n, const float* qw) {
    BlockIQ4_NL* b = static_cast<BlockIQ4_NL*>(dst);
    float w[QK4_0];
    for (int64_t i = 0; i < n / QK4_0; ++i, src += QK4_0) {
        element_weights(src, QK4_0, qw ? qw + i * QK4_0 : nullptr, w);
        const float d = search_scale(src, w);
        b[i].d = float_to_half(d);
        pack_levels(src, d != 0.0f ? 1 / d : 0.0f, b[i].qs);
    }
}

}  // namespace

void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) { quantize_iq4_xs(src, dst, n, nullptr); }

// As quantize_row_iq4_xs's search on one block of 32, its d stored as f16 and the levels re-fitted to it
// (ggml's quantize_iq4_nl, what llama-quantize writes IQ4_NL weights with).
void quantize_row_iq4_nl_search(const float* src, void* dst, int64_t n) {
    quantize_iq4_nl_search(src, dst, n, nullptr);
}

void quantize_iq4_xs_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    quantize_iq4_xs(src, dst, n, qw);
}
void quantize_iq4_nl_weighted(const float* src, void* dst, int64_t n, const float* qw) {
    quantize_iq4_nl_search(src, dst, n, qw);
}

// A block whose largest magnitude is below 1e-15 is stored as d = 0 (every value 0).
void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
    BlockIQ4_NL* b = static_cast<BlockIQ4_NL*>(dst);
    for (int64_t i = 0; i < n / QK4_0; ++i, src += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; ++j) {
            const float ax = std::fabs(src[j]);
            if (ax > amax) {
                amax = ax;
                max = src[j];
            }
        }
        uint8_t level[QK4_0] = {};
        float d = 0.0f;
        if (amax >= 1e-15f) {
            const float id = 1.0f / (max / float(kvalues_iq4nl[0]));
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int j = 0; j < QK4_0; ++j) {
                level[j] = uint8_t(nearest_level(id * src[j]));
                const float q = float(kvalues_iq4nl[level[j]]), w = src[j] * src[j];
                sumqx += w * q * src[j];
                sumq2 += w * q * q;
            }
            d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
        }
        b[i].d = float_to_half(d);
        for (int j = 0; j < 16; ++j) b[i].qs[j] = uint8_t(level[j] | level[j + 16] << 4);
    }
}

}  // namespace ember
