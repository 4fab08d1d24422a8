// The scalar block decoders: each quantized type's block as integers (quants with the type's offset
// removed, integer sub-block scales and mins) and its float d, dmin. The scalar dequantize
// (quant_legacy.cpp, quant_kquants.cpp) and the scalar dot products (cpu/vec_dot_scalar.cpp) read
// every type through these, so a type's bit layout is written once on the CPU.
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant_tables.h"

namespace ember {

// ---- 32-element blocks: q[j] of element j, minus the type's offset (Q4_0 8, Q5_0 16; 0 for the
// types with a min, whose value is d * q + m).

// Q4_0 / Q4_1: element j in the low nibble of qs[j], element j + 16 in its high nibble.
inline void decode_q4(const uint8_t* qs, int offset, int* q) {
    for (int j = 0; j < 16; ++j) {
        q[j] = (qs[j] & 0x0F) - offset;
        q[j + 16] = (qs[j] >> 4) - offset;
    }
}

// Q5_0 / Q5_1: the Q4 nibbles plus bit 4 of element j from bit j of qh (little-endian u32).
inline void decode_q5(const uint8_t* qs, const uint8_t* qh, int offset, int* q) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    for (int j = 0; j < 16; ++j) {
        q[j] = ((qs[j] & 0x0F) | int(((h >> j) & 1) << 4)) - offset;
        q[j + 16] = ((qs[j] >> 4) | int(((h >> (j + 16)) & 1) << 4)) - offset;
    }
}

// ---- Table types (MXFP4, IQ4_NL, the sub-blocks of IQ4_XS): the nibble layout of Q4_0, each
// nibble an index into a table of int8 values (quant_tables.h).
inline void decode_table4(const uint8_t* qs, const int8_t* table, int* q) {
    for (int j = 0; j < 16; ++j) {
        q[j] = table[qs[j] & 0x0F];
        q[j + 16] = table[qs[j] >> 4];
    }
}

// MXFP4's block scale: half the e8m0 power of two 2^(e - 127), as bits (e < 2 gives a subnormal).
inline float e8m0_half(uint8_t e) { return f32_from_bits(e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23); }

// IQ4_XS: the signed scale of sub-block j (0..7).
inline int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
    const int lo = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0x0F, hi = (b.scales_h >> (2 * j)) & 3;
    return (lo | (hi << 4)) - 32;
}

// ---- K-quants: a super-block as q[256] and an integer scale and min per 16 elements, so that
// value[e] = d * sc[e / 16] * q[e] - dmin * mn[e / 16] (mn and dmin are 0 for Q3_K and Q6_K).
struct KDecoded {
    int q[QK_K];
    int sc[16];
    int mn[16];
    float d, dmin;
};

inline void decode_q2_k(const BlockQ2_K& a, KDecoded& k) {
    // element 128c + 32s + l = bits 2s..2s+1 of qs[32c + l]
    for (int e = 0; e < QK_K; ++e) {
        const int c = e / 128, s = (e % 128) / 32, l = e % 32;
        k.q[e] = (a.qs[32 * c + l] >> (2 * s)) & 3;
    }
    for (int g = 0; g < 16; ++g) {
        k.sc[g] = a.scales[g] & 0x0F;
        k.mn[g] = a.scales[g] >> 4;
    }
    k.d = half_to_float(a.d);
    k.dmin = half_to_float(a.dmin);
}

inline void decode_q3_k(const BlockQ3_K& a, KDecoded& k) {
    for (int e = 0; e < QK_K; ++e) {
        const int c = e / 128, s = (e % 128) / 32, l = e % 32;
        const int ql = (a.qs[32 * c + l] >> (2 * s)) & 3;
        k.q[e] = ql - (((a.hmask[l] >> (e / 32)) & 1) ? 0 : 4);
    }
    // 16 six-bit scales: low 4 bits in bytes 0-7 (nibble g / 8), high 2 bits in bytes 8-11.
    for (int g = 0; g < 16; ++g) {
        const int lo = (a.scales[g % 8] >> (4 * (g / 8))) & 0x0F;
        const int hi = (a.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        k.sc[g] = (lo | (hi << 4)) - 32;
        k.mn[g] = 0;
    }
    k.d = half_to_float(a.d);
    k.dmin = 0;
}

// Q4_K / Q5_K (qh null for Q4_K): sub-block j of 32 has one scale and min (get_scale_min_k4).
template <class Block>
inline void decode_q45_k(const Block& a, const uint8_t* qh, KDecoded& k) {
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, a.scales, sc, m);
        k.sc[2 * j] = k.sc[2 * j + 1] = sc;
        k.mn[2 * j] = k.mn[2 * j + 1] = m;
        for (int l = 0; l < 32; ++l) {
            int v = (a.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
            if (qh) v |= ((qh[l] >> j) & 1) << 4;
            k.q[32 * j + l] = v;
        }
    }
    k.d = half_to_float(a.d);
    k.dmin = half_to_float(a.dmin);
}

inline void decode_q4_k(const BlockQ4_K& a, KDecoded& k) { decode_q45_k(a, nullptr, k); }
inline void decode_q5_k(const BlockQ5_K& a, KDecoded& k) { decode_q45_k(a, a.qh, k); }

// IQ4_XS as a K-quant: both 16-element halves of sub-block j take its scale; no mins.
inline void decode_iq4_xs(const BlockIQ4_XS& a, KDecoded& k) {
    for (int j = 0; j < 8; ++j) {
        decode_table4(a.qs + 16 * j, kvalues_iq4nl, k.q + 32 * j);
        k.sc[2 * j] = k.sc[2 * j + 1] = iq4_xs_scale(a, j);
        k.mn[2 * j] = k.mn[2 * j + 1] = 0;
    }
    k.d = half_to_float(a.d);
    k.dmin = 0;
}

inline void decode_q6_k(const BlockQ6_K& a, KDecoded& k) {
    // half h (128 elements): element 128h + 32k + l from ql[64h + l + 32(k & 1)] nibble k / 2 and
    // bits 2k..2k+1 of qh[32h + l]
    for (int e = 0; e < QK_K; ++e) {
        const int h = e / 128, kk = (e % 128) / 32, l = e % 32;
        const int lo = (a.ql[64 * h + l + 32 * (kk & 1)] >> (4 * (kk >> 1))) & 0x0F;
        const int hi = (a.qh[32 * h + l] >> (2 * kk)) & 3;
        k.q[e] = (lo | (hi << 4)) - 32;
    }
    for (int g = 0; g < 16; ++g) {
        k.sc[g] = a.scales[g];
        k.mn[g] = 0;
    }
    k.d = half_to_float(a.d);
    k.dmin = 0;
}

}  // namespace ember
