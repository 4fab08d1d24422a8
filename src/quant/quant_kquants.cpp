// The 256-element super-block K-quants: scalar dequantize for Q2_K..Q8_K (through quant/decode.h) and error-minimising
// quantizers for Q4_K, Q5_K, Q6_K (the search llama.cpp's reference quantizer does: several
// candidate scales, each refined by weighted least squares) plus Q8_K for activations.
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/decode.h"
#include "quant/half.h"
#include "quant/kernels.h"
#include "quant/quant_weighted.h"

// Dequantize is bit-exact with gguf.quants only when products and sums round separately
// (fp-contract=off: no fused multiply-add even with -march=native).
// The scale searches are the hot loops of model quantization, and GCC 12's -O3 (Release)
// vectorisation makes them slower than -O2 does, so this file stays at -O2.
#pragma GCC optimize("O2", "fp-contract=off")

namespace ember {
namespace {

// Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves the rounded
// integer in the low mantissa bits (branch-free and vectorisable, unlike lrintf).
inline int nearest(float v) {
    const float shifted = v + 12582912.0f;
    int32_t bits;
    std::memcpy(&bits, &shifted, 4);
    return (bits & 0x007FFFFF) - 0x00400000;
}
inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
// Same rounding as nearest(), staying in float: exact for |v| < 2^22.
inline float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }
inline float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }
inline float sum8(const float* s) { return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])); }

// Fits x[i] ~= scale * L[i] - min_out with L in [0, nmax] and min_out >= 0, minimising the
// w-weighted squared error: start from the min/max grid, then try nstep+1 grids
// (nmax + rmin + rdelta*k) / (max - min), each refined by the closed-form weighted least
// squares (scale, offset) for its L; keep the best. Returns scale.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float rmin, float rdelta, int nstep,
                    float& min_out) {
    float mn = x[0], mx = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; ++i) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (mn > 0) mn = 0;
    if (mx == mn) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        min_out = -mn;
        return 0.0f;
    }
    float iscale = nmax / (mx - mn);
    float scale = 1.0f / iscale;
    float best_err = 0.0f;
    float Lf[32], Laux[32];
    for (int i = 0; i < n; ++i) {
        Lf[i] = clampf(round_even(iscale * (x[i] - mn)), 0.0f, float(nmax));
        const float diff = scale * Lf[i] + mn - x[i];
        best_err += w[i] * diff * diff;
    }
    for (int k = 0; k <= nstep; ++k) {
        iscale = (rmin + rdelta * k + nmax) / (mx - mn);
        // 8 independent partial sums per statistic: shorter dependency chains
        float s_l[8] = {}, s_l2[8] = {}, s_xl[8] = {};
        for (int i = 0; i < n; ++i) {
            const float l = clampf(round_even(iscale * (x[i] - mn)), 0.0f, float(nmax));
            Laux[i] = l;
            s_l[i % 8] += w[i] * l;
            s_l2[i % 8] += w[i] * l * l;
            s_xl[i % 8] += w[i] * l * x[i];
        }
        const float sum_l = sum8(s_l), sum_l2 = sum8(s_l2), sum_xl = sum8(s_xl);
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D <= 0) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {   // the offset may only shift values down (stored as -min >= 0)
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float e[8] = {};
        for (int i = 0; i < n; ++i) {
            const float diff = this_scale * Laux[i] + this_min - x[i];
            e[i % 8] += w[i] * diff * diff;
        }
        const float err = sum8(e);
        if (err < best_err) {
            std::memcpy(Lf, Laux, sizeof(float) * size_t(n));
            best_err = err;
            scale = this_scale;
            mn = this_min;
        }
    }
    for (int i = 0; i < n; ++i) L[i] = uint8_t(Lf[i]);
    min_out = -mn;
    return scale;
}

// Fits x[i] ~= scale * (L[i] - nmax) with L - nmax in [-nmax, nmax - 1], weighting by x^2 (errors
// on large values count most): 19 candidate grids around nmax / max|x|, each with its least squares
// scale. Returns scale (signed: maps the largest-magnitude value to -nmax).
float fit_scale_symmetric(int n, int nmax, const float* x, uint8_t* L) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        for (int i = 0; i < n; ++i) L[i] = uint8_t(nmax);
        return 0.0f;
    }
    float best_scale = 0, best = -1;
    for (int k = -9; k <= 9; ++k) {
        const float iscale = -(nmax + 0.1f * k) / max;
        float sumlx = 0, suml2 = 0;
        int l_tmp[32];
        for (int i = 0; i < n; ++i) {
            const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            l_tmp[i] = l;
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        // the error with the optimal scale sumlx/suml2 falls as sumlx^2/suml2 grows
        if (suml2 > 0 && (best < 0 || sumlx * sumlx > best * suml2)) {
            best_scale = sumlx / suml2;
            best = best_scale * sumlx;
            for (int i = 0; i < n; ++i) L[i] = uint8_t(l_tmp[i] + nmax);
        }
    }
    if (best < 0) {
        for (int i = 0; i < n; ++i) L[i] = uint8_t(nmax);
        return 0.0f;
    }
    return best_scale;
}

// Q4_K/Q5_K: 8 sub-block (scale, min) pairs quantized to 6 bits against the super-block
// maxima; writes d, dmin, the packed scales, and the final L (requantized with the stored
// scales so rounding of the 6-bit scales is absorbed). With an importance matrix, quant_k_weighted.cpp.
void quantize_superblock_k(const float* x, int nmax, float rmin, float rdelta, int nstep, uint16_t& d_out,
                           uint16_t& dmin_out, uint8_t* packed, uint8_t* L) {
    float sum_x2 = 0;
    for (int i = 0; i < QK_K; ++i) sum_x2 += x[i] * x[i];
    const float av_x = std::sqrt(sum_x2 / QK_K);
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 32; ++i) w[i] = av_x + std::fabs(x[32 * j + i]);
        scales[j] = fit_scale_min(32, nmax, x + 32 * j, w, L + 32 * j, rmin, rdelta, nstep, mins[j]);
        max_scale = scales[j] > max_scale ? scales[j] : max_scale;
        max_min = mins[j] > max_min ? mins[j] : max_min;
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    std::memset(packed, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; ++j) {
        const int ls = clampi(nearest(inv_scale * scales[j]), 0, 63);
        const int lm = clampi(nearest(inv_min * mins[j]), 0, 63);
        if (j < 4) {
            packed[j] = uint8_t(ls);
            packed[j + 4] = uint8_t(lm);
        } else {
            packed[j + 4] = uint8_t((ls & 0x0F) | ((lm & 0x0F) << 4));
            packed[j - 4] |= uint8_t((ls >> 4) << 6);
            packed[j] |= uint8_t((lm >> 4) << 6);
        }
    }
    d_out = float_to_half(max_scale / 63.0f);
    dmin_out = float_to_half(max_min / 63.0f);
    const float d = half_to_float(d_out), dmin = half_to_float(dmin_out);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, packed, sc, m);
        const float dj = d * sc;
        if (dj == 0.0f) continue;
        const float dm = dmin * m;
        for (int i = 0; i < 32; ++i) {
            L[32 * j + i] = uint8_t(clampi(nearest((x[32 * j + i] + dm) / dj), 0, nmax));
        }
    }
}

// value = d * sc * q - dmin * mn per 16 elements, from the type's decoder (quant/decode.h); the
// types without mins (Q3_K, Q6_K) skip the min term.
template <class Block, void (*Decode)(const Block&, KDecoded&), bool kHasMin>
void dequantize_row_k(const void* src, float* dst, int64_t n) {
    const Block* b = static_cast<const Block*>(src);
    KDecoded k;
    for (int64_t i = 0; i < n / QK_K; ++i, dst += QK_K) {
        Decode(b[i], k);
        for (int g = 0; g < 16; ++g) {
            const float dl = k.d * float(k.sc[g]), ml = kHasMin ? k.dmin * float(k.mn[g]) : 0.0f;
            for (int l = 0; l < 16; ++l) {
                const float v = dl * float(k.q[16 * g + l]);
                dst[16 * g + l] = kHasMin ? v - ml : v;
            }
        }
    }
}
}  // namespace

void dequantize_row_q2_k(const void* src, float* dst, int64_t n) {
    dequantize_row_k<BlockQ2_K, decode_q2_k, true>(src, dst, n);
}
void dequantize_row_q3_k(const void* src, float* dst, int64_t n) {
    dequantize_row_k<BlockQ3_K, decode_q3_k, false>(src, dst, n);
}
void dequantize_row_q4_k(const void* src, float* dst, int64_t n) {
    dequantize_row_k<BlockQ4_K, decode_q4_k, true>(src, dst, n);
}
void dequantize_row_q5_k(const void* src, float* dst, int64_t n) {
    dequantize_row_k<BlockQ5_K, decode_q5_k, true>(src, dst, n);
}
void dequantize_row_q6_k(const void* src, float* dst, int64_t n) {
    dequantize_row_k<BlockQ6_K, decode_q6_k, false>(src, dst, n);
}

void dequantize_row_q8_k(const void* src, float* dst, int64_t n) {
    const BlockQ8_K* b = static_cast<const BlockQ8_K*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i, dst += QK_K) {
        for (int e = 0; e < QK_K; ++e) dst[e] = b[i].d * float(b[i].qs[e]);
    }
}

namespace {

void quantize_q4_k(const float* src, void* dst, int64_t n) {
    BlockQ4_K* b = static_cast<BlockQ4_K*>(dst);
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        quantize_superblock_k(src, 15, -1.0f, 0.1f, 20, b[i].d, b[i].dmin, b[i].scales, L);
        for (int c = 0; c < 4; ++c) {
            for (int l = 0; l < 32; ++l) {
                b[i].qs[32 * c + l] = uint8_t(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
            }
        }
    }
}

void quantize_q5_k(const float* src, void* dst, int64_t n) {
    BlockQ5_K* b = static_cast<BlockQ5_K*>(dst);
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        quantize_superblock_k(src, 31, -0.5f, 0.1f, 15, b[i].d, b[i].dmin, b[i].scales, L);
        std::memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int c = 0; c < 4; ++c) {
            for (int l = 0; l < 32; ++l) {
                const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                b[i].qs[32 * c + l] = uint8_t((lo & 0x0F) | ((hi & 0x0F) << 4));
                b[i].qh[l] |= uint8_t(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            }
        }
    }
}

void quantize_q6_k(const float* src, void* dst, int64_t n) {
    BlockQ6_K* b = static_cast<BlockQ6_K*>(dst);
    uint8_t L[QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        float max_scale = 0, max_abs = 0;
        for (int g = 0; g < 16; ++g) {
            scales[g] = fit_scale_symmetric(16, 32, src + 16 * g, L + 16 * g);
            if (std::fabs(scales[g]) > max_abs) {
                max_abs = std::fabs(scales[g]);
                max_scale = scales[g];
            }
        }
        if (max_abs < 1e-15f) {
            std::memset(&b[i], 0, sizeof(BlockQ6_K));
            continue;
        }
        const float iscale = -128.0f / max_scale;
        b[i].d = float_to_half(1.0f / iscale);
        for (int g = 0; g < 16; ++g) {
            const int s = nearest(iscale * scales[g]);
            b[i].scales[g] = int8_t(s > 127 ? 127 : s);
        }
        const float d = half_to_float(b[i].d);
        for (int g = 0; g < 16; ++g) {
            const float dg = d * b[i].scales[g];
            if (dg == 0.0f) continue;
            for (int l = 0; l < 16; ++l) {
                L[16 * g + l] = uint8_t(clampi(nearest(src[16 * g + l] / dg), -32, 31) + 32);
            }
        }
        for (int h = 0; h < 2; ++h) {
            const uint8_t* q = L + 128 * h;
            for (int l = 0; l < 32; ++l) {
                const int q1 = q[l], q2 = q[l + 32], q3 = q[l + 64], q4 = q[l + 96];
                b[i].ql[64 * h + l] = uint8_t((q1 & 0x0F) | ((q3 & 0x0F) << 4));
                b[i].ql[64 * h + l + 32] = uint8_t((q2 & 0x0F) | ((q4 & 0x0F) << 4));
                b[i].qh[32 * h + l] = uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

}  // namespace

void quantize_row_q4_k(const float* src, void* dst, int64_t n) { quantize_q4_k(src, dst, n); }
void quantize_row_q5_k(const float* src, void* dst, int64_t n) { quantize_q5_k(src, dst, n); }
void quantize_row_q6_k(const float* src, void* dst, int64_t n) { quantize_q6_k(src, dst, n); }

// Q8_K: d = max|x|/127 with the largest-magnitude value mapped to -127, as ggml does since its IQ2 kernels (q
// clamped to 127 where a value a rounding ulp past the largest would reach 128).
void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
    BlockQ8_K* b = static_cast<BlockQ8_K*>(dst);
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        float amax = 0, max = 0;
        for (int e = 0; e < QK_K; ++e) {
            if (std::fabs(src[e]) > amax) {
                amax = std::fabs(src[e]);
                max = src[e];
            }
        }
        if (amax == 0.0f) {
            std::memset(&b[i], 0, sizeof(BlockQ8_K));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int e = 0; e < QK_K; ++e) {
            const int v = nearest(iscale * src[e]);
            b[i].qs[e] = int8_t(v > 127 ? 127 : v);
        }
        for (int g = 0; g < 16; ++g) {
            int sum = 0;
            for (int l = 0; l < 16; ++l) sum += b[i].qs[16 * g + l];
            b[i].bsums[g] = int16_t(sum);
        }
        b[i].d = 1.0f / iscale;
    }
}

}  // namespace ember
