// The attention arithmetic on ARM64 NEON (attention_math.h): the loops of attention_math_simd.h
// on a 16-float vector of four q registers. Lane l of a vector holds what iteration l of the
// scalar loop computes, with the same single IEEE operations in the same order (this file builds
// with -ffp-contract=off, so a multiply and an add never fuse), so it returns the scalar's bits.
// Elsewhere kAttentionMathNeon is the scalar table (never chosen: the level is neon on ARM64 only).
#include "cpu/attention_math.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>
#include <cstring>

namespace ember {
namespace {

struct v16 {
    float32x4_t r[4];
};
inline v16 zero() { return {{vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)}}; }
inline v16 load(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
inline void store(float* p, v16 a) {
    for (int k = 0; k < 4; ++k) vst1q_f32(p + 4 * k, a.r[k]);
}
inline v16 operator+(v16 a, v16 b) {
    return {{vaddq_f32(a.r[0], b.r[0]), vaddq_f32(a.r[1], b.r[1]), vaddq_f32(a.r[2], b.r[2]), vaddq_f32(a.r[3], b.r[3])}};
}
inline v16 operator*(v16 a, float s) {
    return {{vmulq_n_f32(a.r[0], s), vmulq_n_f32(a.r[1], s), vmulq_n_f32(a.r[2], s), vmulq_n_f32(a.r[3], s)}};
}

// f16 <-> f32 by FCVTL / FCVTN: round to nearest even (the default FPCR mode), subnormals kept,
// overflow to inf, as float_to_half / half_to_float.
inline float32x4_t from_f16(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline float32x4_t round_f16(float32x4_t a) { return vcvt_f32_f16(vcvt_f16_f32(a)); }

// Four key groups at a time: four independent sums hide the add latency; each lane's sum
// still runs over i in order.
void scores(const float* q, const float* kt, int32_t D, int32_t n_groups, float scale, float* prob) {
    constexpr int L = kAttentionLanes;
    int32_t g = 0;
    for (; g + 4 <= n_groups; g += 4) {
        const float* k = kt + (int64_t)g * D * L;
        v16 a0 = zero(), a1 = zero(), a2 = zero(), a3 = zero();
        for (int32_t i = 0; i < D; ++i) {
            const float qi = q[i];
            a0 = a0 + load(k + i * L) * qi;
            a1 = a1 + load(k + (D + i) * L) * qi;
            a2 = a2 + load(k + (2 * D + i) * L) * qi;
            a3 = a3 + load(k + (3 * D + i) * L) * qi;
        }
        store(prob + g * L, a0 * scale);
        store(prob + (g + 1) * L, a1 * scale);
        store(prob + (g + 2) * L, a2 * scale);
        store(prob + (g + 3) * L, a3 * scale);
    }
    for (; g < n_groups; ++g) {
        const float* k = kt + (int64_t)g * D * L;
        v16 a = zero();
        for (int32_t i = 0; i < D; ++i) a = a + load(k + i * L) * q[i];
        store(prob + g * L, a * scale);
    }
}

void scale_round(const float* x, int32_t n, float mul, bool to_f16, float* y) {
    int32_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float32x4_t v = vmulq_n_f32(vld1q_f32(x + j), mul);
        vst1q_f32(y + j, to_f16 ? round_f16(v) : v);
    }
    float tail[4] = {};
    std::memcpy(tail, x + j, sizeof(float) * (n - j));
    const float32x4_t v = vmulq_n_f32(vld1q_f32(tail), mul);
    vst1q_f32(tail, to_f16 ? round_f16(v) : v);
    std::memcpy(y + j, tail, sizeof(float) * (n - j));
}

// D % 16 == 0. Up to 64 output elements (four vectors) per pass over the positions.
void weighted_sum(const float* w, const float* v, int32_t D, int32_t len, float* o) {
    int32_t c = 0;
    for (; c + 64 <= D; c += 64) {
        v16 a0 = zero(), a1 = zero(), a2 = zero(), a3 = zero();
        for (int32_t p = 0; p < len; ++p) {
            const float* r = v + (int64_t)p * D + c;
            const float wp = w[p];
            a0 = a0 + load(r) * wp;
            a1 = a1 + load(r + 16) * wp;
            a2 = a2 + load(r + 32) * wp;
            a3 = a3 + load(r + 48) * wp;
        }
        store(o + c, a0);
        store(o + c + 16, a1);
        store(o + c + 32, a2);
        store(o + c + 48, a3);
    }
    for (; c < D; c += 16) {
        v16 a = zero();
        for (int32_t p = 0; p < len; ++p) a = a + load(v + (int64_t)p * D + c) * w[p];
        store(o + c, a);
    }
}

void f16_to_f32(const uint16_t* src, int32_t n, float* dst) {
    int32_t j = 0;
    for (; j + 4 <= n; j += 4) vst1q_f32(dst + j, from_f16(src + j));
    uint16_t tail[4] = {};
    std::memcpy(tail, src + j, sizeof(uint16_t) * (n - j));
    float out[4];
    vst1q_f32(out, from_f16(tail));
    std::memcpy(dst + j, out, sizeof(float) * (n - j));
}

// Lane-wise x > m ? x : m, the scalar comparison (vmaxq_f32 would return a NaN operand).
inline float32x4_t keep_max(float32x4_t x, float32x4_t m) { return vbslq_f32(vcgtq_f32(x, m), x, m); }

float max(const float* x, int32_t n) {
    float32x4_t m[4];
    for (int k = 0; k < 4; ++k) m[k] = vdupq_n_f32(-INFINITY);
    int32_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int k = 0; k < 4; ++k) m[k] = keep_max(vld1q_f32(x + j + 4 * k), m[k]);
    float r = -INFINITY;
    for (; j < n; ++j) r = x[j] > r ? x[j] : r;
    float lanes[16];
    for (int k = 0; k < 4; ++k) vst1q_f32(lanes + 4 * k, m[k]);
    for (int l = 0; l < 16; ++l) r = lanes[l] > r ? lanes[l] : r;
    return r;
}

// r[j] = column j of the 4x4 matrix whose rows were r[0..4).
inline void transpose4(float32x4_t r[4]) {
    const float32x4_t t0 = vtrn1q_f32(r[0], r[1]);   // a0 b0 a2 b2
    const float32x4_t t1 = vtrn2q_f32(r[0], r[1]);   // a1 b1 a3 b3
    const float32x4_t t2 = vtrn1q_f32(r[2], r[3]);   // c0 d0 c2 d2
    const float32x4_t t3 = vtrn2q_f32(r[2], r[3]);   // c1 d1 c3 d3
    auto pairs = [](float32x4_t a) { return vreinterpretq_f64_f32(a); };
    r[0] = vreinterpretq_f32_f64(vtrn1q_f64(pairs(t0), pairs(t2)));
    r[1] = vreinterpretq_f32_f64(vtrn1q_f64(pairs(t1), pairs(t3)));
    r[2] = vreinterpretq_f32_f64(vtrn2q_f64(pairs(t0), pairs(t2)));
    r[3] = vreinterpretq_f32_f64(vtrn2q_f64(pairs(t1), pairs(t3)));
}

// One transposed key group: 8 columns of rows h..h+3 at a time, converted then transposed as
// two 4x4 blocks. D % 16 == 0.
void gather_keys16_f16(const uint16_t* rows, int64_t row_stride, int32_t D, float* kt) {
    for (int32_t c = 0; c < D; c += 8)
        for (int h = 0; h < kAttentionLanes; h += 4) {
            float32x4_t lo[4], hi[4];
            for (int l = 0; l < 4; ++l) {
                const float16x8_t r = vreinterpretq_f16_u16(vld1q_u16(rows + (h + l) * row_stride + c));
                lo[l] = vcvt_f32_f16(vget_low_f16(r));
                hi[l] = vcvt_high_f32_f16(r);
            }
            transpose4(lo);
            transpose4(hi);
            for (int j = 0; j < 4; ++j) {
                vst1q_f32(kt + (int64_t)(c + j) * kAttentionLanes + h, lo[j]);
                vst1q_f32(kt + (int64_t)(c + 4 + j) * kAttentionLanes + h, hi[j]);
            }
        }
}

}  // namespace

const AttentionMath kAttentionMathNeon{scores, scale_round, weighted_sum, f16_to_f32, max, gather_keys16_f16};

}  // namespace ember
#else
namespace ember {
const AttentionMath kAttentionMathNeon = kAttentionMathScalar;
}  // namespace ember
#endif
