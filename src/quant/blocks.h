// ggml's quantized block structs (byte-exact layouts as stored in GGUF), with size checks.
// Every struct is a plain byte image: fp16 fields are raw uint16_t bits, no padding.
#pragma once
#include <cstdint>
#include <cstring>

namespace ember {

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32;
constexpr int QK_K = 256;          // super-block size of the K-quants
constexpr int K_SCALE_SIZE = 12;   // Q4_K/Q5_K: 8 six-bit scales + 8 six-bit mins

// x[i] = d * (q[i] - 8); q[i] = low nibble of qs[i] (i < 16), high nibble of qs[i - 16].
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
};
// x[i] = d * q[i] + m
struct BlockQ4_1 {
    uint16_t d, m;
    uint8_t qs[QK4_1 / 2];
};
// 5-bit: low nibbles as Q4_0, bit 4 of element j is bit j of qh (little-endian u32).
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
};
struct BlockQ5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};
// Activation format for the *_1 weights: s = d * sum(qs).
struct BlockQ8_1 {
    uint16_t d, s;
    int8_t qs[QK8_1];
};

// 16 sub-blocks of 16: x = d * (scales & 15) * q - dmin * (scales >> 4), q 2-bit.
struct BlockQ2_K {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d, dmin;
};
// 16 sub-blocks of 16 with 6-bit signed scales (offset 32); q = 2 low bits - 4 * !hmask bit.
struct BlockQ3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};
// 8 sub-blocks of 32: x = d * sc[j] * q - dmin * m[j]; qs chunk c (32 bytes) holds sub-block
// 2c in its low nibbles and 2c + 1 in its high nibbles.
struct BlockQ4_K {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
};
// As Q4_K; bit 4 of element l of sub-block j is bit j of qh[l].
struct BlockQ5_K {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
// 16 sub-blocks of 16 with int8 scales: x = d * scales[g] * (q - 32), q 6-bit split in ql/qh.
struct BlockQ6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
// Activation format for the K-quants: float scale, bsums[g] = sum of qs[16g .. 16g + 15].
struct BlockQ8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};

// 32 e2m1 values (the nibble layout of Q4_0) with a shared e8m0 exponent:
// x[i] = 2^(e - 128) * kvalues_mxfp4[q[i]] (quant_tables.h; the table holds the values doubled).
struct BlockMXFP4 {
    uint8_t e;
    uint8_t qs[QK4_0 / 2];
};
// The nibble layout of Q4_0 through a non-uniform table: x[i] = d * kvalues_iq4nl[q[i]].
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
};
// 8 sub-blocks of 32, each laid out as an IQ4_NL block's quants (16 bytes), with a 6-bit scale:
// low 4 bits in nibble j % 2 of scales_l[j / 2], high 2 bits in bits 2j, 2j + 1 of scales_h;
// x = d * (scale - 32) * kvalues_iq4nl[q].
struct BlockIQ4_XS {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};

// 8 sub-blocks of 32, each 8 points of iq3s_grid (4 values each; the index is a qs byte and bit l
// of qh[sub-block] as bit 8), 32 sign bits (bit e % 8 of signs[e / 8] negates element e) and a 4-bit
// scale s (nibble j % 2 of scales[j / 2]): x = d * (1 + 2 s) * value * sign.
struct BlockIQ3_S {
    uint16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[QK_K / 64];
};

// 8 sub-blocks of 32: 8 points of iq3xxs_grid each (qs[8 j + l]), then a word per sub-block (at
// qs[64 + 4 j]) holding four 7-bit sign indices (ksigns_iq2xs, one per 8 values) and in its top 4
// bits the scale s: x = d * (s + 1/2) / 2 * value * sign.
struct BlockIQ3_XXS {
    uint16_t d;
    uint8_t qs[3 * QK_K / 8];
};

// 8 sub-blocks of 32, each two words: the first 4 indices of 8-value points of iq2xxs_grid (a byte
// each), the second four 7-bit sign indices (ksigns_iq2xs) and in its top 4 bits the scale s:
// x = d * (s + 1/2) / 4 * value * sign.
struct BlockIQ2_XXS {
    uint16_t d;
    uint8_t qs[QK_K / 4];
};

// 32 points of 8 values of iq2xs_grid: qs[l]'s low 9 bits index point l, its top 7 its signs
// (ksigns_iq2xs); a 4-bit scale s per 16 values (nibble g % 2 of scales[g / 2]):
// x = d * (s + 1/2) / 4 * value * sign.
struct BlockIQ2_XS {
    uint16_t d;
    uint16_t qs[QK_K / 8];
    uint8_t scales[QK_K / 32];
};

// 32 points of 8 values of iq2s_grid: point l's index is qs[l] with bits 2 (l % 4), 2 (l % 4) + 1
// of qh[l / 4] as bits 8, 9; signs[l] negates its values (bit i value i); a 4-bit scale s per 16
// values (nibble g % 2 of scales[g / 2]): x = d * (s + 1/2) / 4 * value * sign.
struct BlockIQ2_S {
    uint16_t d;
    uint8_t qs[QK_K / 8];
    uint8_t signs[QK_K / 8];
    uint8_t qh[QK_K / 32];
    uint8_t scales[QK_K / 32];
};

static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block size");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block size");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block size");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block size");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block size");
static_assert(sizeof(BlockQ8_1) == 36, "Q8_1 block size");
static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block size");
static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block size");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block size");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block size");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block size");
static_assert(sizeof(BlockQ8_K) == 292, "Q8_K block size");
static_assert(sizeof(BlockMXFP4) == 17, "MXFP4 block size");
static_assert(sizeof(BlockIQ4_NL) == 18, "IQ4_NL block size");
static_assert(sizeof(BlockIQ4_XS) == 136, "IQ4_XS block size");
static_assert(sizeof(BlockIQ3_S) == 110, "IQ3_S block size");
static_assert(sizeof(BlockIQ3_XXS) == 98, "IQ3_XXS block size");
static_assert(sizeof(BlockIQ2_XXS) == 66, "IQ2_XXS block size");
static_assert(sizeof(BlockIQ2_XS) == 74, "IQ2_XS block size");
static_assert(sizeof(BlockIQ2_S) == 82, "IQ2_S block size");

// Q4_K/Q5_K: unpack the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
// Bytes 0-3: scales 0-3 (low 6 bits), bytes 4-7: mins 0-3 (low 6 bits); bytes 8-11: low
// nibble = scale 4-7 low bits, high nibble = min 4-7 low bits; the top 2 bits of bytes 0-7
// carry the high bits of scale/min 4-7.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// The same unpacking for all 8 at once: scales and mins as 8 bytes each (little-endian u64),
// for the SIMD kernels.
inline void unpack_scales_k4(const uint8_t* p, uint64_t& sc, uint64_t& mn) {
    uint32_t a, b, c;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + 4, 4);
    std::memcpy(&c, p + 8, 4);
    const uint32_t sc_lo = a & 0x3F3F3F3Fu, mn_lo = b & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (c & 0x0F0F0F0Fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t mn_hi = ((c >> 4) & 0x0F0F0F0Fu) | (((b >> 6) & 0x03030303u) << 4);
    sc = uint64_t(sc_lo) | (uint64_t(sc_hi) << 32);
    mn = uint64_t(mn_lo) | (uint64_t(mn_hi) << 32);
}

}  // namespace ember
