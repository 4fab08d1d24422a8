// Inline fp16 / bf16 <-> fp32 bit conversions (IEEE round-to-nearest-even, NaNs kept NaN)
// shared by the quant reference code and the kernels; ember::fp16_to_fp32 etc. wrap these.
#pragma once
#include <cstdint>
#include <cstring>

namespace ember {

inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float f32_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1F;
    const uint32_t mant = h & 0x3FF;
    if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant << 13));   // inf / NaN
    if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
    // zero or subnormal: mant * 2^-24, exact in fp32
    const float v = float(mant) * 5.9604644775390625e-08f;
    return f32_from_bits(sign | f32_bits(v));
}

inline uint16_t float_to_half(float f) {
    const uint32_t x = f32_bits(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return uint16_t(sign | 0x7E00 | ((ax >> 13) & 0x3FF));   // quiet NaN
    if (ax >= 0x47800000u) return uint16_t(sign | 0x7C00);   // >= 65536 (or inf): inf
    if (ax < 0x38800000u) {
        // result is subnormal (or zero): value / 2^-24 rounded to nearest even integer
        if (ax < 0x33000000u) return sign;   // < 2^-25: rounds to zero
        const uint32_t e = ax >> 23;         // 102..112
        const uint32_t m = (ax & 0x7FFFFF) | 0x800000;
        const uint32_t shift = 126 - e;      // 14..24: m * 2^(e-150) / 2^-24 = m >> (126 - e)
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1))) ++r;
        return uint16_t(sign | r);
    }
    // normal: rebias exponent, round the 13 dropped mantissa bits to nearest even; a carry
    // into the exponent (up to inf) is the correct result.
    uint32_t r = (ax - 0x38000000u) >> 13;
    const uint32_t rem = ax & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
    return uint16_t(sign | r);
}

inline float bf16_to_float(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((x >> 16) | 0x0040);   // quiet NaN
    x += 0x7FFF + ((x >> 16) & 1);
    return uint16_t(x >> 16);
}

}  // namespace ember
