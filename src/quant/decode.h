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

// IQ3_S as a K-quant: q = grid value with its sign, sc = 1 + 2 s for both halves of a sub-block.
inline void decode_iq3_s(const BlockIQ3_S& a, KDecoded& k) {
    for (int j = 0; j < 8; ++j) {
        for (int l = 0; l < 8; ++l) {
            const uint32_t point = iq3s_grid.v[a.qs[8 * j + l] | (((a.qh[j] >> l) & 1) << 8)];
            for (int i = 0; i < 4; ++i) {
                const int e = 32 * j + 4 * l + i;
                const int v = int((point >> (8 * i)) & 0xFF);
                k.q[e] = (a.signs[e / 8] >> (e % 8)) & 1 ? -v : v;
            }
        }
        k.sc[2 * j] = k.sc[2 * j + 1] = 1 + 2 * ((a.scales[j / 2] >> (4 * (j % 2))) & 0x0F);
        k.mn[2 * j] = k.mn[2 * j + 1] = 0;
    }
    k.d = half_to_float(a.d);
    k.dmin = 0;
}

// IQ3_XXS: sub-block j's word of sign indices and scale, and its 32 sign bits (bit e for element e).
inline uint32_t iq3_xxs_aux(const BlockIQ3_XXS& a, int j) {
    uint32_t aux;
    std::memcpy(&aux, a.qs + 64 + 4 * j, 4);
    return aux;
}
inline uint32_t iq2_signs32(uint32_t aux) {
    uint32_t s = 0;
    for (int k = 0; k < 4; ++k) s |= uint32_t(ksigns_iq2xs[(aux >> (7 * k)) & 127]) << (8 * k);
    return s;
}

// IQ3_XXS as a K-quant: q = grid value with its sign, sc = 2 s + 1 and d / 4 (so that d * sc is
// gguf's d * (s + 1/2) * 1/2, the factors of two exact).
inline void decode_iq3_xxs(const BlockIQ3_XXS& a, KDecoded& k) {
    for (int j = 0; j < 8; ++j) {
        const uint32_t aux = iq3_xxs_aux(a, j), signs = iq2_signs32(aux);
        for (int l = 0; l < 8; ++l) {
            const uint32_t point = iq3xxs_grid.v[a.qs[8 * j + l]];
            for (int i = 0; i < 4; ++i) {
                const int v = int((point >> (8 * i)) & 0xFF), e = 4 * l + i;
                k.q[32 * j + e] = (signs >> e) & 1 ? -v : v;
            }
        }
        k.sc[2 * j] = k.sc[2 * j + 1] = 2 * int(aux >> 28) + 1;
        k.mn[2 * j] = k.mn[2 * j + 1] = 0;
    }
    k.d = half_to_float(a.d) * 0.25f;
    k.dmin = 0;
}

// IQ2_XXS as a K-quant: point l of sub-block j is its first word's byte l, its signs and scale
// 2 s + 1 from the second word as IQ3_XXS's; d / 8 (gguf's d * (s + 1/2) * 1/4).
inline void decode_iq2_xxs(const BlockIQ2_XXS& a, KDecoded& k) {
    for (int j = 0; j < 8; ++j) {
        uint32_t aux[2];
        std::memcpy(aux, a.qs + 8 * j, 8);
        const uint32_t signs = iq2_signs32(aux[1]);
        for (int e = 0; e < 32; ++e) {
            const uint32_t word = iq2xxs_grid.v[2 * ((aux[0] >> (8 * (e / 8))) & 0xFF) + (e % 8) / 4];
            const int v = int((word >> (8 * (e % 4))) & 0xFF);
            k.q[32 * j + e] = (signs >> e) & 1 ? -v : v;
        }
        k.sc[2 * j] = k.sc[2 * j + 1] = 2 * int(aux[1] >> 28) + 1;
        k.mn[2 * j] = k.mn[2 * j + 1] = 0;
    }
    k.d = half_to_float(a.d) * 0.125f;
    k.dmin = 0;
}

// IQ2_XS as a K-quant: sc = 2 s + 1 per 16 values, d / 8.
inline void decode_iq2_xs(const BlockIQ2_XS& a, KDecoded& k) {
    for (int l = 0; l < QK_K / 8; ++l) {
        const uint32_t signs = ksigns_iq2xs[a.qs[l] >> 9], p = a.qs[l] & 511;
        for (int i = 0; i < 8; ++i) {
            const int v = int((iq2xs_grid.v[2 * p + i / 4] >> (8 * (i % 4))) & 0xFF);
            k.q[8 * l + i] = (signs >> i) & 1 ? -v : v;
        }
    }
    for (int g = 0; g < 16; ++g) {
        k.sc[g] = 2 * ((a.scales[g / 2] >> (4 * (g % 2))) & 0x0F) + 1;
        k.mn[g] = 0;
    }
    k.d = half_to_float(a.d) * 0.125f;
    k.dmin = 0;
}

// IQ2_S: the grid index of point l (0..31).
inline uint32_t iq2_s_point(const BlockIQ2_S& a, int l) {
    return a.qs[l] | (((a.qh[l / 4] >> (2 * (l % 4))) & 3u) << 8);
}

// IQ2_S as a K-quant: as IQ2_XS, its signs a byte a point.
inline void decode_iq2_s(const BlockIQ2_S& a, KDecoded& k) {
    for (int l = 0; l < QK_K / 8; ++l) {
        const uint32_t p = iq2_s_point(a, l);
        for (int i = 0; i < 8; ++i) {
            const int v = int((iq2s_grid.v[2 * p + i / 4] >> (8 * (i % 4))) & 0xFF);
            k.q[8 * l + i] = (a.signs[l] >> i) & 1 ? -v : v;
        }
    }
    for (int g = 0; g < 16; ++g) {
        k.sc[g] = 2 * ((a.scales[g / 2] >> (4 * (g % 2))) & 0x0F) + 1;
        k.mn[g] = 0;
    }
    k.d = half_to_float(a.d) * 0.125f;
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

#include "quant/decode_low_bit.h"
