// ARM64 NEON activation quantizers (Q8_0, Q8_1, Q8_K): the same bytes as the scalar
// quantize_row_q8_0 / _q8_1 (quant_legacy.cpp) and quantize_row_q8_k (quant_kquants.cpp), with
// the rounding in one instruction (FCVTAS: halves away from zero, as roundf; FCVTNS: to nearest
// even, as nearest()) instead of a libm call per value. Blocks with a NaN or an infinity, or whose
// scale overflows, go through the scalar code. Elsewhere the lookup answers "none".
#include "cpu/isa_kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>

#include "cpu/quantize_q8_rows.h"

namespace ember {
namespace {

constexpr float kFloatMax = 3.4028235e38f;

// One block of 32: d = amax / 127, q = round-half-away(x * (1 / d)), the scalar formulas in the
// same float steps; returns d, or a negative value when the block is not finite.
inline float block_q8(const float* x, int8_t* q, int* sum) {
    float32x4_t v[8];
    float32x4_t amax = vdupq_n_f32(0);
    uint32x4_t ordered = vdupq_n_u32(~0u);
    for (int k = 0; k < 8; ++k) {
        v[k] = vld1q_f32(x + 4 * k);
        amax = vmaxq_f32(amax, vabsq_f32(v[k]));
        ordered = vandq_u32(ordered, vceqq_f32(v[k], v[k]));
    }
    const float m = vmaxvq_f32(amax);
    const float d = m / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (vminvq_u32(ordered) == 0 || !(m <= kFloatMax) || !(id <= kFloatMax)) return -1.0f;
    int32x4_t qi[8];
    for (int k = 0; k < 8; ++k) qi[k] = vcvtaq_s32_f32(vmulq_n_f32(v[k], id));
    int32x4_t s = vdupq_n_s32(0);
    for (int k = 0; k < 8; ++k) s = vaddq_s32(s, qi[k]);
    *sum = vaddvq_s32(s);
    // int32 -> int8 by truncating narrows: |q| <= 127
    for (int k = 0; k < 2; ++k) {
        const int16x8_t a = vcombine_s16(vmovn_s32(qi[4 * k]), vmovn_s32(qi[4 * k + 1]));
        const int16x8_t b = vcombine_s16(vmovn_s32(qi[4 * k + 2]), vmovn_s32(qi[4 * k + 3]));
        vst1q_s8(q + 16 * k, vcombine_s8(vmovn_s16(a), vmovn_s16(b)));
    }
    return d;
}

// Q8_K, one super-block of 256: iscale = -127 / (the first value of largest magnitude), q =
// nearest-even(iscale * x) capped at 127, bsums of 16.
void q8_k_rows(const float* src, void* dst, int64_t n) {
    BlockQ8_K* b = static_cast<BlockQ8_K*>(dst);
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        float32x4_t amax = vdupq_n_f32(0);
        uint32x4_t finite = vdupq_n_u32(~0u);
        for (int e = 0; e < QK_K; e += 4) {
            const float32x4_t a = vabsq_f32(vld1q_f32(src + e));
            finite = vandq_u32(finite, vcleq_f32(a, vdupq_n_f32(kFloatMax)));   // false for inf, NaN
            amax = vmaxq_f32(amax, a);
        }
        const float am = vmaxvq_f32(amax);
        if (vminvq_u32(finite) == 0 || am == 0.0f) {   // (an all-zero block: the scalar code writes zeros)
            quantize_row_q8_k(src, &b[i], QK_K);
            continue;
        }
        int first = 0;   // the scalar loop keeps the first value of largest magnitude
        while (std::fabs(src[first]) != am) ++first;
        const float iscale = -127.0f / src[first];
        if (!(std::fabs(iscale) <= kFloatMax)) {
            quantize_row_q8_k(src, &b[i], QK_K);
            continue;
        }
        for (int g = 0; g < QK_K / 16; ++g) {
            int32x4_t qi[4];
            for (int k = 0; k < 4; ++k)
                qi[k] = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(src + 16 * g + 4 * k), iscale)),
                                  vdupq_n_s32(127));
            const int16x8_t a = vcombine_s16(vmovn_s32(qi[0]), vmovn_s32(qi[1]));
            const int16x8_t c = vcombine_s16(vmovn_s32(qi[2]), vmovn_s32(qi[3]));
            vst1q_s8(b[i].qs + 16 * g, vcombine_s8(vmovn_s16(a), vmovn_s16(c)));
            b[i].bsums[g] = int16_t(vaddvq_s32(vaddq_s32(vaddq_s32(qi[0], qi[1]), vaddq_s32(qi[2], qi[3]))));
        }
        b[i].d = 1.0f / iscale;
    }
}

}  // namespace

QuantizeRowFn quantize_row_neon(GGMLType type) {
    return type == GGMLType::Q8_K ? q8_k_rows : q8_row_quantizer<block_q8>(type);
}

}  // namespace ember
#else
namespace ember {
QuantizeRowFn quantize_row_neon(GGMLType) { return nullptr; }
}  // namespace ember
#endif
