// ARM64 NEON dot products of Q2_K and Q3_K x Q8_K: exact integer sums per super-block, then the
// scalar reference's float step (this file builds without FMA contraction, CMakeLists.txt), so each
// result is vec_dot_scalar's bit for bit. Elsewhere the lookup answers "none".
#include "cpu/isa_kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <type_traits>

#include "cpu/q2_q3_k.h"
#include "quant/blocks.h"
#include "quant/half.h"

namespace ember {
namespace {

template <bool Q3>
using KBlock = std::conditional_t<Q3, BlockQ3_K, BlockQ2_K>;

// sum(a[i] * b[i]) of 16 int8 pairs in four int32 lanes (|a * b| <= 2^14 fits the int16 products).
inline int32x4_t dot16(int8x16_t a, int8x16_t b) {
    return vpadalq_s16(vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b));
}

// Element 128h + 32k + l is bits 2k, 2k + 1 of qs[32h + l], in group 8h + 2k + l / 16 (Q3_K: minus 4
// where bit 4h + k of hmask[l] is clear).
template <bool Q3>
float dot(int64_t n, const void* wv, const void* xv) {
    const KBlock<Q3>* w = static_cast<const KBlock<Q3>*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const uint8x16_t m3 = vdupq_n_u8(3);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const KBlock<Q3>& b = w[i];
        int8_t sc[16];
        int32_t summ = 0;
        if constexpr (Q3) {
            uint8_t biased[16];
            q3_k_biased_scales(b.scales, biased);
            vst1q_s8(sc, vsubq_s8(vreinterpretq_s8_u8(vld1q_u8(biased)), vdupq_n_s8(32)));
        } else {
            const uint8x16_t packed = vld1q_u8(b.scales);
            vst1q_s8(sc, vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(0x0F))));
            const uint8x16_t mn = vshrq_n_u8(packed, 4);
            const int16x8_t mn0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn)));
            const int16x8_t mn1 = vreinterpretq_s16_u16(vmovl_high_u8(mn));
            const int32x4_t p = vmlal_high_s16(vmull_s16(vget_low_s16(mn0), vld1_s16(x[i].bsums)), mn0,
                                               vld1q_s16(x[i].bsums));
            const int32x4_t p1 = vmlal_high_s16(vmull_s16(vget_low_s16(mn1), vld1_s16(x[i].bsums + 8)), mn1,
                                                vld1q_s16(x[i].bsums + 8));
            summ = vaddvq_s32(vaddq_s32(p, p1));
        }
        uint8x16_t hm0 = vdupq_n_u8(0), hm1 = vdupq_n_u8(0);
        if constexpr (Q3) {
            hm0 = vld1q_u8(b.hmask);
            hm1 = vld1q_u8(b.hmask + 16);
        }
        int32x4_t acc = vdupq_n_s32(0);
        for (int h = 0; h < 2; ++h) {
            const uint8x16_t q0 = vld1q_u8(b.qs + 32 * h), q1 = vld1q_u8(b.qs + 32 * h + 16);
            for (int k = 0; k < 4; ++k) {
                const int8x16_t shift = vdupq_n_s8(int8_t(-2 * k));
                int8x16_t v0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, shift), m3));
                int8x16_t v1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, shift), m3));
                if constexpr (Q3) {
                    const uint8x16_t bit = vdupq_n_u8(uint8_t(1 << (4 * h + k))), four = vdupq_n_u8(4);
                    v0 = vsubq_s8(v0, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(hm0, bit))));
                    v1 = vsubq_s8(v1, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(hm1, bit))));
                }
                const int8_t* xq = x[i].qs + 128 * h + 32 * k;
                const int g = 8 * h + 2 * k;
                acc = vmlaq_n_s32(acc, dot16(v0, vld1q_s8(xq)), sc[g]);
                acc = vmlaq_n_s32(acc, dot16(v1, vld1q_s8(xq + 16)), sc[g + 1]);
            }
        }
        const float dmin = half_to_float(dmin_bits(b));
        s += k_block_term(x[i].d, half_to_float(b.d), dmin, vaddvq_s32(acc), summ);
    }
    return s;
}

}  // namespace

VecDotFn vec_dot_q2_q3_neon(GGMLType type) {
    if (type == GGMLType::Q2_K) return dot<false>;
    if (type == GGMLType::Q3_K) return dot<true>;
    return nullptr;
}

}  // namespace ember
#else
namespace ember {
VecDotFn vec_dot_q2_q3_neon(GGMLType) { return nullptr; }
}  // namespace ember
#endif
