// ARM64 NEON dot products of the ternary, 1-bit and NVFP4 types (TQ1_0, TQ2_0, IQ1_S, IQ1_M x Q8_K,
// NVFP4 x Q8_0): exact integer sums of 16 weight bytes a step and the scalar reference's float
// expression per block (or sub-block), so each result is vec_dot_scalar's bit for bit.
#include "cpu/isa_kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include "quant/decode.h"

namespace ember {
namespace {

// sum(a[i] * b[i]) of 16 int8 pairs (|a * b| <= 2^14 fits int16).
inline int32_t dot16(int8x16_t a, const int8_t* x) {
    const int8x16_t b = vld1q_s8(x);
    return vaddvq_s32(vpadalq_s16(vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b)));
}

// Base-3 digit bytes q as -1, 0, 1: -1 + [q > 85] + [q > 170].
inline int8x16_t ternary(uint8x16_t q) {
    const int8x16_t c1 = vreinterpretq_s8_u8(vcgtq_u8(q, vdupq_n_u8(85)));
    const int8x16_t c2 = vreinterpretq_s8_u8(vcgtq_u8(q, vdupq_n_u8(170)));
    return vsubq_s8(vsubq_s8(vdupq_n_s8(-1), c1), c2);
}
inline uint8x16_t times3(uint8x16_t q) { return vaddq_u8(vaddq_u8(q, q), q); }

float dot_tq1_0(int64_t n, const void* wv, const void* xv) {
    const BlockTQ1_0* w = static_cast<const BlockTQ1_0*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const int8_t* xq = x[i].qs;
        int sumi = 0;
        uint8x16_t a = vld1q_u8(w[i].qs), b = vld1q_u8(w[i].qs + 16), c = vld1q_u8(w[i].qs + 32);
        for (int k = 0; k < 5; ++k, a = times3(a), b = times3(b), c = times3(c)) {
            sumi += dot16(ternary(a), xq + 32 * k) + dot16(ternary(b), xq + 32 * k + 16);
            sumi += dot16(ternary(c), xq + 160 + 16 * k);
        }
        uint8_t h[16];
        for (int k = 0, m = 1; k < 4; ++k, m *= 3)
            for (int j = 0; j < 4; ++j) h[4 * k + j] = uint8_t(w[i].qh[j] * m);
        sumi += dot16(ternary(vld1q_u8(h)), xq + 240);
        s += x[i].d * (half_to_float(w[i].d) * float(sumi));
    }
    return s;
}

float dot_tq2_0(int64_t n, const void* wv, const void* xv) {
    const BlockTQ2_0* w = static_cast<const BlockTQ2_0*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const uint8x16_t three = vdupq_n_u8(3);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int sumi = 0;
        for (int c = 0; c < 4; ++c) {   // 16-byte quarters: c / 2 the 128-value half, c % 2 its bytes 0-15 or 16-31
            const uint8x16_t q = vld1q_u8(w[i].qs + 16 * c);
            const int8_t* xq = x[i].qs + 128 * (c / 2) + 16 * (c % 2);
            sumi += dot16(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, three)), vdupq_n_s8(1)), xq);
            sumi += dot16(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q, 2), three)), vdupq_n_s8(1)), xq + 32);
            sumi += dot16(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q, 4), three)), vdupq_n_s8(1)), xq + 64);
            sumi += dot16(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 6)), vdupq_n_s8(1)), xq + 96);
        }
        s += x[i].d * (half_to_float(w[i].d) * float(sumi));
    }
    return s;
}

// Two points of iq1s_grid (16 values -1, 0, 1) as 8 value + their shifts.
inline int8x16_t iq1_pair(uint32_t p0, uint32_t p1, int8_t sh0, int8_t sh1) {
    const int8_t* g = reinterpret_cast<const int8_t*>(iq1s_grid.v);
    const int8x16_t v = vshlq_n_s8(vcombine_s8(vld1_s8(g + 8 * p0), vld1_s8(g + 8 * p1)), 3);
    return vaddq_s8(v, vcombine_s8(vdup_n_s8(sh0), vdup_n_s8(sh1)));
}

float dot_iq1_s(int64_t n, const void* wv, const void* xv) {
    const BlockIQ1_S* w = static_cast<const BlockIQ1_S*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int sumi = 0;
        for (int j = 0; j < 8; ++j) {
            const uint32_t h = w[i].qh[j];
            const int8_t sh = h & 0x8000 ? -1 : 1;
            uint32_t p[4];
            for (int l = 0; l < 4; ++l) p[l] = w[i].qs[4 * j + l] | (((h >> (3 * l)) & 7) << 8);
            const int sum = dot16(iq1_pair(p[0], p[1], sh, sh), x[i].qs + 32 * j) +
                            dot16(iq1_pair(p[2], p[3], sh, sh), x[i].qs + 32 * j + 16);
            sumi += (2 * int((h >> 12) & 7) + 1) * sum;
        }
        s += x[i].d * (half_to_float(w[i].d) * 0.125f * float(sumi));
    }
    return s;
}

float dot_iq1_m(int64_t n, const void* wv, const void* xv) {
    const BlockIQ1_M* w = static_cast<const BlockIQ1_M*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        uint16_t sw[4];
        iq1_m_scale_words(w[i], sw);
        int sumi = 0;
        for (int g = 0; g < 16; ++g) {   // points 2 g, 2 g + 1: nibbles 0 and 1 of qh[g]
            const uint32_t h = w[i].qh[g];
            const uint32_t p0 = w[i].qs[2 * g] | ((h & 7) << 8), p1 = w[i].qs[2 * g + 1] | (((h >> 4) & 7) << 8);
            const int sum = dot16(iq1_pair(p0, p1, h & 0x08 ? -1 : 1, h & 0x80 ? -1 : 1), x[i].qs + 16 * g);
            sumi += (2 * int((sw[g / 4] >> (3 * (g % 4))) & 7) + 1) * sum;
        }
        s += x[i].d * (half_to_float(iq1_m_d(sw)) * 0.125f * float(sumi));
    }
    return s;
}

float dot_nvfp4(int64_t n, const void* wv, const void* xv) {
    const BlockNVFP4* w = static_cast<const BlockNVFP4*>(wv);
    const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
    const int8x16_t table = vld1q_s8(kvalues_mxfp4);
    float s = 0;
    for (int64_t i = 0; i < n / QK_NVFP4; ++i) {
        for (int sb = 0; sb < 4; ++sb) {
            const BlockQ8_0& xb = x[2 * i + sb / 2];
            const uint8x8_t q = vld1_u8(w[i].qs + 8 * sb);
            const uint8x16_t codes = vcombine_u8(vand_u8(q, vdup_n_u8(0x0F)), vshr_n_u8(q, 4));
            const int si = dot16(vqtbl1q_s8(table, codes), xb.qs + 16 * (sb % 2));
            s += half_to_float(xb.d) * ue4m3_half(w[i].d[sb]) * float(si);
        }
    }
    return s;
}

}  // namespace

VecDotFn vec_dot_low_bit_neon(GGMLType type) {
    switch (type) {
        case GGMLType::TQ1_0: return dot_tq1_0;
        case GGMLType::TQ2_0: return dot_tq2_0;
        case GGMLType::IQ1_S: return dot_iq1_s;
        case GGMLType::IQ1_M: return dot_iq1_m;
        case GGMLType::NVFP4: return dot_nvfp4;
        default: return nullptr;
    }
}

}  // namespace ember
#else
namespace ember {
VecDotFn vec_dot_low_bit_neon(GGMLType) { return nullptr; }
}  // namespace ember
#endif
