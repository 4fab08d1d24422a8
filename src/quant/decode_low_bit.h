// The block layouts and scalar decoders of the ternary and 1-bit types (TQ1_0, TQ2_0, IQ1_S, IQ1_M) and
// of NVFP4; each is decoded once here, for the scalar dequantize (quant_low_bit.cpp), the scalar dots
// (cpu/vec_dot_scalar.cpp) and the SIMD kernels' tails. Included by decode.h.
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/decode.h"

namespace ember {

// 256 values -1, 0, 1 in base 3, five to a byte (byte b holds floor(256 * code / 243) rounded up,
// so that digit k is ((uint8)(b * 3^k) * 3) >> 8): qs[m] (m < 32) holds values 32 k + m, qs[32 + m]
// (m < 16) values 160 + 16 k + m (k = 0..4), qh[j] values 240 + 4 k + j (k = 0..3); x = d * value.
struct BlockTQ1_0 {
    uint8_t qs[48];
    uint8_t qh[4];
    uint16_t d;
};
// 256 values -1, 0, 1 as 2-bit codes (code - 1): value 128 c + 32 s + m is bits 2 s, 2 s + 1 of
// qs[32 c + m]; x = d * value.
struct BlockTQ2_0 {
    uint8_t qs[QK_K / 4];
    uint16_t d;
};
// 8 sub-blocks of 32, each 4 points of 8 values -1, 0, 1 (iq1s_grid; index: qs[4 j + l] and bits
// 3 l .. 3 l + 2 of qh[j] as bits 8-10), a 3-bit scale s (bits 12-14 of qh[j]) and a shift of
// +-1/8 (bit 15 set: negative): x = d * (2 s + 1) * (value + shift).
struct BlockIQ1_S {
    uint16_t d;
    uint8_t qs[QK_K / 8];
    uint16_t qh[QK_K / 32];
};
// 32 points of 8 values of iq1s_grid: point l's index is qs[l] and bits 0-2 of nibble l % 2 of qh[l / 2]
// as bits 8-10, bit 3 of that nibble its shift's sign; a 3-bit scale s per 16 values (bits
// 3 (g % 4) .. of scale word g / 4) and the fp16 d in the top nibbles of the 4 scale words (word w
// holding bits 4 w .. 4 w + 3): x = d * (2 s + 1) * (value + shift).
struct BlockIQ1_M {
    uint8_t qs[QK_K / 8];
    uint8_t qh[QK_K / 16];
    uint8_t scales[QK_K / 32];
};
// 4 sub-blocks of 16 with an unsigned e4m3 scale each (d[s]); sub-block s's 8 quant bytes hold
// its values 0-7 in their low nibbles, 8-15 in their high ones, e2m1 codes as MXFP4's:
// x = e4m3(d[s]) * kvalues_mxfp4[q] / 2.
constexpr int QK_NVFP4 = 64;
struct BlockNVFP4 {
    uint8_t d[4];
    uint8_t qs[QK_NVFP4 / 2];
};

static_assert(sizeof(BlockTQ1_0) == 54, "TQ1_0 block size");
static_assert(sizeof(BlockTQ2_0) == 66, "TQ2_0 block size");
static_assert(sizeof(BlockIQ1_S) == 50, "IQ1_S block size");
static_assert(sizeof(BlockIQ1_M) == 56, "IQ1_M block size");
static_assert(sizeof(BlockNVFP4) == 36, "NVFP4 block size");

// Half an unsigned e4m3 scale (the table's values are doubled), as bits: bit 7 is ignored and
// 0x7f (e4m3's NaN) reads as zero, as ggml reads it.
inline float ue4m3_half(uint8_t x) {
    const uint32_t e = (x >> 3) & 15, m = x & 7;
    if (x == 0x7F || (e == 0 && m == 0)) return 0.0f;
    // normal: (1 + m / 8) * 2^(e - 8); subnormal: m * 2^-10
    return e ? f32_from_bits((e + 119) << 23 | m << 20) : float(m) * 0x1p-10f;
}

// TQ1_0: digit k (0..4) of a base-3 byte, as -1, 0, 1.
inline int tq1_digit(uint8_t b, int k) {
    static constexpr uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return ((uint8_t(b * pow3[k]) * 3) >> 8) - 1;
}

inline void decode_tq1_0(const BlockTQ1_0& a, KDecoded& k) {
    for (int d = 0; d < 5; ++d) {
        for (int m = 0; m < 32; ++m) k.q[32 * d + m] = tq1_digit(a.qs[m], d);
        for (int m = 0; m < 16; ++m) k.q[160 + 16 * d + m] = tq1_digit(a.qs[32 + m], d);
    }
    for (int d = 0; d < 4; ++d)
        for (int j = 0; j < 4; ++j) k.q[240 + 4 * d + j] = tq1_digit(a.qh[j], d);
    for (int g = 0; g < 16; ++g) {
        k.sc[g] = 1;
        k.mn[g] = 0;
    }
    k.d = half_to_float(a.d);
    k.dmin = 0;
}

inline void decode_tq2_0(const BlockTQ2_0& a, KDecoded& k) {
    for (int e = 0; e < QK_K; ++e) {
        const int c = e / 128, s = (e % 128) / 32, m = e % 32;
        k.q[e] = ((a.qs[32 * c + m] >> (2 * s)) & 3) - 1;
    }
    for (int g = 0; g < 16; ++g) {
        k.sc[g] = 1;
        k.mn[g] = 0;
    }
    k.d = half_to_float(a.d);
    k.dmin = 0;
}

// Value i (0..7) of point p of iq1s_grid: -1, 0 or 1.
inline int iq1_value(uint32_t p, int i) { return int8_t(iq1s_grid.v[2 * p + i / 4] >> (8 * (i % 4))); }

// IQ1_S as a K-quant: q = 8 value + shift (the shift 1/8 made an integer), sc = 2 s + 1, d / 8.
inline void decode_iq1_s(const BlockIQ1_S& a, KDecoded& k) {
    for (int j = 0; j < 8; ++j) {
        const uint32_t h = a.qh[j];
        const int shift = h & 0x8000 ? -1 : 1;
        for (int l = 0; l < 4; ++l) {
            const uint32_t p = a.qs[4 * j + l] | (((h >> (3 * l)) & 7) << 8);
            for (int i = 0; i < 8; ++i) k.q[32 * j + 8 * l + i] = 8 * iq1_value(p, i) + shift;
        }
        k.sc[2 * j] = k.sc[2 * j + 1] = 2 * int((h >> 12) & 7) + 1;
        k.mn[2 * j] = k.mn[2 * j + 1] = 0;
    }
    k.d = half_to_float(a.d) * 0.125f;
    k.dmin = 0;
}

// IQ1_M: the 4 scale words, and its fp16 d gathered from their top nibbles.
inline void iq1_m_scale_words(const BlockIQ1_M& a, uint16_t* w) { std::memcpy(w, a.scales, 8); }
inline uint16_t iq1_m_d(const uint16_t* w) {
    return uint16_t((w[0] >> 12) | ((w[1] >> 8) & 0x00F0) | ((w[2] >> 4) & 0x0F00) | (w[3] & 0xF000));
}

// IQ1_M as a K-quant: as IQ1_S with a shift per point and a scale per 16 values.
inline void decode_iq1_m(const BlockIQ1_M& a, KDecoded& k) {
    uint16_t w[4];
    iq1_m_scale_words(a, w);
    for (int l = 0; l < QK_K / 8; ++l) {
        const uint32_t nib = (a.qh[l / 2] >> (4 * (l % 2))) & 15;
        const uint32_t p = a.qs[l] | ((nib & 7) << 8);
        const int shift = nib & 8 ? -1 : 1;
        for (int i = 0; i < 8; ++i) k.q[8 * l + i] = 8 * iq1_value(p, i) + shift;
    }
    for (int g = 0; g < 16; ++g) {
        k.sc[g] = 2 * int((w[g / 4] >> (3 * (g % 4))) & 7) + 1;
        k.mn[g] = 0;
    }
    k.d = half_to_float(iq1_m_d(w)) * 0.125f;
    k.dmin = 0;
}

// NVFP4: sub-block s (16 values) of a block as table values (doubled e2m1).
inline void decode_nvfp4_sub(const BlockNVFP4& a, int s, int* q) {
    for (int j = 0; j < 8; ++j) {
        q[j] = kvalues_mxfp4[a.qs[8 * s + j] & 0x0F];
        q[j + 8] = kvalues_mxfp4[a.qs[8 * s + j] >> 4];
    }
}

}  // namespace ember
