// What the Q2_K / Q3_K SIMD dots and prompt tiles of every ISA share (q2_q3_*.cpp): Q3_K's packed
// scales as bytes, and the scalar reference's float step per super-block, which they repeat so that
// each result is vec_dot_scalar's bit for bit (the integer sums are exact in any order).
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"

namespace ember {

// A super-block's fp16 dmin (Q3_K has none: +0, the reference's 0 for it).
inline uint16_t dmin_bits(const BlockQ2_K& b) { return b.dmin; }
inline uint16_t dmin_bits(const BlockQ3_K&) { return 0; }

// Q3_K's 16 six-bit scales plus 32, byte g for scale g (decode_q3_k's layout: the low 4 bits in
// nibble g / 8 of scales[g % 8], the high 2 in bits 2 (g / 4) of scales[8 + g % 4]), four at a time.
inline void q3_k_biased_scales(const uint8_t* packed, uint8_t* out) {
    uint32_t a[3];
    std::memcpy(a, packed, 12);
    const uint32_t lo4 = 0x0F0F0F0F, lo2 = 0x03030303;
    const uint32_t u[4] = {(a[0] & lo4) | ((a[2] & lo2) << 4), (a[1] & lo4) | (((a[2] >> 2) & lo2) << 4),
                           ((a[0] >> 4) & lo4) | (((a[2] >> 4) & lo2) << 4),
                           ((a[1] >> 4) & lo4) | (((a[2] >> 6) & lo2) << 4)};
    std::memcpy(out, u, 16);
}

// dot_k_decoded's value of one super-block: x_d * (d * sumi - dmin * summ), in its order (dmin and
// summ 0 for Q3_K, as the reference has them). The files that include this build without FMA
// contraction (CMakeLists.txt), as the reference does.
inline float k_block_term(float xd, float d, float dmin, int32_t sumi, int32_t summ) {
    return xd * (d * float(sumi) - dmin * float(summ));
}

}  // namespace ember
