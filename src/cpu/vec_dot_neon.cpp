// ARM64 NEON dot products of Q4_0 and Q8_0 weights with Q8_0 activations, and of Q4_1 weights with
// Q8_1 activations (Advanced SIMD is part of
// every ARMv8-A core, so no flags or run-time check). The integer sum of a block is exact in any
// order and the float step per block is the scalar reference's own expression, so each result is
// vec_dot_scalar's bit for bit. Elsewhere the lookup answers "none".
#include "cpu/isa_kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include "quant/blocks.h"
#include "quant/half.h"

namespace ember {
namespace {

// sum(a[i] * b[i]) of 16 + 16 int8 pairs: widening products, pairwise-added into int32 lanes.
inline int32_t dot32_s8(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(a0), vget_low_s8(b0)));
    acc = vpadalq_s16(acc, vmull_high_s8(a0, b0));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a1), vget_low_s8(b1)));
    acc = vpadalq_s16(acc, vmull_high_s8(a1, b1));
    return vaddvq_s32(acc);
}

float dot_q8_0(int64_t n, const void* w, const void* x) {
    const BlockQ8_0* a = static_cast<const BlockQ8_0*>(w);
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
    float s = 0;
    for (int64_t i = 0; i < n / QK8_0; ++i) {
        const int32_t si = dot32_s8(vld1q_s8(a[i].qs), vld1q_s8(a[i].qs + 16), vld1q_s8(b[i].qs), vld1q_s8(b[i].qs + 16));
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(si);
    }
    return s;
}

// The 32 4-bit values of a Q4 block as int8, `offset` subtracted: qs byte j holds element j in
// its low nibble and element j + 16 in its high one.
inline void q4_values(const uint8_t* qs, int8_t offset, int8x16_t& lo, int8x16_t& hi) {
    const uint8x16_t q = vld1q_u8(qs);
    lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), vdupq_n_s8(offset));
    hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(offset));
}

float dot_q4_0(int64_t n, const void* w, const void* x) {
    const BlockQ4_0* a = static_cast<const BlockQ4_0*>(w);
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
    float s = 0;
    for (int64_t i = 0; i < n / QK4_0; ++i) {
        int8x16_t lo, hi;
        q4_values(a[i].qs, 8, lo, hi);
        const int32_t si = dot32_s8(lo, hi, vld1q_s8(b[i].qs), vld1q_s8(b[i].qs + 16));
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(si);
    }
    return s;
}

float dot_q4_1(int64_t n, const void* w, const void* x) {
    const BlockQ4_1* a = static_cast<const BlockQ4_1*>(w);
    const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
    float s = 0;
    for (int64_t i = 0; i < n / QK4_1; ++i) {
        int8x16_t lo, hi;
        q4_values(a[i].qs, 0, lo, hi);
        const int32_t si = dot32_s8(lo, hi, vld1q_s8(b[i].qs), vld1q_s8(b[i].qs + 16));
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(si) +
             half_to_float(a[i].m) * half_to_float(b[i].s);
    }
    return s;
}

}  // namespace

VecDotFn vec_dot_neon(GGMLType type) {
    switch (type) {
        case GGMLType::Q4_0: return dot_q4_0;
        case GGMLType::Q4_1: return dot_q4_1;
        case GGMLType::Q8_0: return dot_q8_0;
        default: return nullptr;
    }
}

}  // namespace ember
#else
namespace ember {
VecDotFn vec_dot_neon(GGMLType) { return nullptr; }
}  // namespace ember
#endif
