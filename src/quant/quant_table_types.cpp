// The table types MXFP4, IQ4_NL, IQ4_XS (nibbles indexing a table of values) and IQ3_S (points of a
// grid): scalar reference dequantize, and MXFP4's quantizer (ggml's: the e8m0 exponent from the block's largest magnitude,
// each value to the nearest table entry). Bit-exact with gguf.quants.
#include <cmath>

#include "quant/blocks.h"
#include "quant/decode.h"
#include "quant/half.h"
#include "quant/kernels.h"

// gguf.quants rounds every product separately (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {

void dequantize_row_mxfp4(const void* src, float* dst, int64_t n) {
    const BlockMXFP4* b = static_cast<const BlockMXFP4*>(src);
    int q[32];
    for (int64_t i = 0; i < n / QK4_0; ++i, dst += QK4_0) {
        const float d = e8m0_half(b[i].e);
        decode_table4(b[i].qs, kvalues_mxfp4, q);
        for (int j = 0; j < 32; ++j) dst[j] = d * float(q[j]);
    }
}

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
    const BlockIQ4_NL* b = static_cast<const BlockIQ4_NL*>(src);
    int q[32];
    for (int64_t i = 0; i < n / QK4_0; ++i, dst += QK4_0) {
        const float d = half_to_float(b[i].d);
        decode_table4(b[i].qs, kvalues_iq4nl, q);
        for (int j = 0; j < 32; ++j) dst[j] = d * float(q[j]);
    }
}

// (d * scale) * value, each product rounded as gguf.quants rounds it.
void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n) {
    const BlockIQ4_XS* b = static_cast<const BlockIQ4_XS*>(src);
    int q[32];
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = half_to_float(b[i].d);
        for (int j = 0; j < 8; ++j, dst += 32) {
            const float dl = d * float(iq4_xs_scale(b[i], j));
            decode_table4(b[i].qs + 16 * j, kvalues_iq4nl, q);
            for (int l = 0; l < 32; ++l) dst[l] = dl * float(q[l]);
        }
    }
}

namespace {

// (d * sc) * q: the grid types' order of rounding in gguf.quants, the sign exact either side.
template <class Block, void (*Decode)(const Block&, KDecoded&)>
void dequantize_grid(const void* src, float* dst, int64_t n) {
    const Block* b = static_cast<const Block*>(src);
    KDecoded k;
    for (int64_t i = 0; i < n / QK_K; ++i, dst += QK_K) {
        Decode(b[i], k);
        for (int e = 0; e < QK_K; ++e) dst[e] = k.d * float(k.sc[e / 16]) * float(k.q[e]);
    }
}

} // namespace

void dequantize_row_iq3_s(const void* src, float* dst, int64_t n) {
    dequantize_grid<BlockIQ3_S, decode_iq3_s>(src, dst, n);
}
void dequantize_row_iq3_xxs(const void* src, float* dst, int64_t n) {
    dequantize_grid<BlockIQ3_XXS, decode_iq3_xxs>(src, dst, n);
}
void dequantize_row_iq2_xxs(const void* src, float* dst, int64_t n) {
    dequantize_grid<BlockIQ2_XXS, decode_iq2_xxs>(src, dst, n);
}
void dequantize_row_iq2_xs(const void* src, float* dst, int64_t n) {
    dequantize_grid<BlockIQ2_XS, decode_iq2_xs>(src, dst, n);
}
void dequantize_row_iq2_s(const void* src, float* dst, int64_t n) {
    dequantize_grid<BlockIQ2_S, decode_iq2_s>(src, dst, n);
}

namespace {

// The first table index whose value times d is nearest x.
int nearest_mxfp4(float x, float d) {
    int best = 0;
    float best_err = std::fabs(float(kvalues_mxfp4[0]) * d - x);
    for (int i = 1; i < 16; ++i) {
        const float err = std::fabs(float(kvalues_mxfp4[i]) * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

} // namespace

// e = floor(log2(amax)) - 2 + 127: the largest magnitude lands in [4, 8) steps of 2^(e - 127),
// the top e2m1 binade (values up to 6); an all-zero block gets e = 0.
void quantize_row_mxfp4(const float* src, void* dst, int64_t n) {
    BlockMXFP4* b = static_cast<BlockMXFP4*>(dst);
    for (int64_t i = 0; i < n / QK4_0; ++i, src += QK4_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK4_0; ++j) amax = std::fabs(src[j]) > amax ? std::fabs(src[j]) : amax;
        // wraps to a byte as ggml's (uint8_t) conversion does on its platforms for |x| below 2^-125
        const uint8_t e = amax > 0.0f ? uint8_t(int(std::floor(std::log2(amax))) - 2 + 127) : 0;
        const float d = e8m0_half(e);
        b[i].e = e;
        for (int j = 0; j < 16; ++j)
            b[i].qs[j] = uint8_t(nearest_mxfp4(src[j], d) | (nearest_mxfp4(src[j + 16], d) << 4));
    }
}

} // namespace ember
