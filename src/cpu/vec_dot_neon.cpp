// ARM64 NEON dot products, the types vec_dot_avx2.cpp covers: Q4_0/Q5_0/Q8_0/MXFP4/IQ4_NL x Q8_0,
// Q4_1/Q5_1 x Q8_1, Q4_K/Q5_K/Q6_K/IQ4_XS/IQ3_S/IQ3_XXS/IQ2_XXS/IQ2_XS/IQ2_S
// x Q8_K, F32/F16/BF16 x F32
// (Advanced SIMD is part of every ARMv8-A core, so no flags or run-time check). Quantized types:
// the integer sums of a block are exact in any order and the float step per block is the scalar
// reference's own expression (both files build without FMA contraction off x86, CMakeLists.txt),
// so each result is vec_dot_scalar's bit for bit. Float types sum in f32 lanes with FMA, as AVX2
// does, where the reference sums in double: equal to float rounding. Elsewhere the lookup answers
// "none".
#include "cpu/isa_kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <cstring>
#include <type_traits>

#include "cpu/legacy_blocks.h"
#include "quant/blocks.h"
#include "quant/decode.h"
#include "quant/half.h"

namespace ember {
namespace {

// sum(a[i] * b[i]) of 16 int8 pairs in four int32 lanes: widening products (|a * b| <= 2^14
// fits int16), pairwise-added.
inline int32x4_t dot16(int8x16_t a, int8x16_t b) {
    return vpadalq_s16(vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b));
}

inline int32_t dot32(int8x16_t a0, int8x16_t a1, const int8_t* x) {
    return vaddvq_s32(vaddq_s32(dot16(a0, vld1q_s8(x)), dot16(a1, vld1q_s8(x + 16))));
}

// ---- 32-element blocks ----

// The 16 nibble bytes of a Q4/Q5 block: byte j holds element j in its low nibble and element
// j + 16 in its high one.
inline void nibbles(const uint8_t* qs, uint8x16_t& lo, uint8x16_t& hi) {
    const uint8x16_t q = vld1q_u8(qs);
    lo = vandq_u8(q, vdupq_n_u8(0x0F));
    hi = vshrq_n_u8(q, 4);
}

// Bit 4 of the Q5 quants: 0x10 in byte j where bit j of the little-endian u32 qh is set.
inline void q5_high_bits(const uint8_t* qh, uint8x16_t& lo, uint8x16_t& hi) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    const uint8x8_t b = vcreate_u8(h);
    const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ULL));
    const uint8x16_t sixteen = vdupq_n_u8(0x10);
    lo = vandq_u8(vtstq_u8(vcombine_u8(vdup_lane_u8(b, 0), vdup_lane_u8(b, 1)), bit), sixteen);
    hi = vandq_u8(vtstq_u8(vcombine_u8(vdup_lane_u8(b, 2), vdup_lane_u8(b, 3)), bit), sixteen);
}

// A block's 32 weights as int8 in element order (lo: 0..15, hi: 16..31), offset removed for the
// *_0 kinds as the scalar decode_q4 / decode_q5 (quant/decode.h) do.
template <Legacy K, class WB>
inline void weight_values(const WB& w, int8x16_t& lo, int8x16_t& hi) {
    if constexpr (K == Legacy::q8_0) {
        lo = vld1q_s8(w.qs);
        hi = vld1q_s8(w.qs + 16);
    } else {
        uint8x16_t l, h;
        nibbles(w.qs, l, h);
        if constexpr (kQ5<K>) {
            uint8x16_t bl, bh;
            q5_high_bits(w.qh, bl, bh);
            l = vorrq_u8(l, bl);
            h = vorrq_u8(h, bh);
        }
        const uint8x16_t offset = vdupq_n_u8(K == Legacy::q4_0 ? 8 : K == Legacy::q5_0 ? 16 : 0);
        lo = vreinterpretq_s8_u8(vsubq_u8(l, offset));
        hi = vreinterpretq_s8_u8(vsubq_u8(h, offset));
    }
}

template <Legacy K>
float dot_legacy(int64_t n, const void* w, const void* x) {
    using WB = typename LegacyBlocks<K>::W;
    using XB = typename LegacyBlocks<K>::X;
    const WB* a = static_cast<const WB*>(w);
    const XB* b = static_cast<const XB*>(x);
    float s = 0;
    for (int64_t i = 0; i < n / 32; ++i) {
        int8x16_t lo, hi;
        weight_values<K>(a[i], lo, hi);
        const int32_t si = dot32(lo, hi, b[i].qs);
        if constexpr (kHasMin<K>)
            s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(si) +
                 half_to_float(a[i].m) * half_to_float(b[i].s);
        else s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(si);
    }
    return s;
}

// ---- Table types (MXFP4, IQ4_NL x Q8_0; IQ4_XS x Q8_K): the nibbles looked up in the 16-entry
// table with tbl, summed as vec_dot_scalar sums them ----

inline void table_values(const uint8_t* qs, int8x16_t table, int8x16_t& lo, int8x16_t& hi) {
    uint8x16_t l, h;
    nibbles(qs, l, h);
    lo = vqtbl1q_s8(table, l);
    hi = vqtbl1q_s8(table, h);
}

inline float table_scale(const BlockMXFP4& b) { return e8m0_half(b.e); }
inline float table_scale(const BlockIQ4_NL& b) { return half_to_float(b.d); }

template <class WB>
float dot_table(int64_t n, const void* w, const void* x) {
    const WB* a = static_cast<const WB*>(w);
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
    const int8x16_t table = vld1q_s8(std::is_same<WB, BlockMXFP4>::value ? kvalues_mxfp4 : kvalues_iq4nl);
    float s = 0;
    for (int64_t i = 0; i < n / 32; ++i) {
        int8x16_t lo, hi;
        table_values(a[i].qs, table, lo, hi);
        s += table_scale(a[i]) * half_to_float(b[i].d) * float(dot32(lo, hi, b[i].qs));
    }
    return s;
}

// dot_k_decoded's float step with no mins: x.d * (d * sumi - 0), the "- 0" exact.
float dot_iq4_xs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ4_XS* w = static_cast<const BlockIQ4_XS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int8x16_t table = vld1q_s8(kvalues_iq4nl);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int j = 0; j < 8; ++j) {
            int8x16_t lo, hi;
            table_values(w[i].qs + 16 * j, table, lo, hi);
            const int32x4_t p = vaddq_s32(dot16(lo, vld1q_s8(x[i].qs + 32 * j)),
                                          dot16(hi, vld1q_s8(x[i].qs + 32 * j + 16)));
            acc = vmlaq_n_s32(acc, p, iq4_xs_scale(w[i], j));
        }
        s += x[i].d * (half_to_float(w[i].d) * float(vaddvq_s32(acc)));
    }
    return s;
}

// The grid types: a sub-block's 8 grid points as 32 bytes, negated where its sign bits are set
// (tested as the Q5 high bits are), summed and times the sub-block's scale.
inline int32x4_t grid_sub_block(const uint32_t* pts, uint32_t signs, int sc0, int sc1, const int8_t* x) {
    const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ULL));
    const uint8x8_t b = vcreate_u8(signs);
    const uint8x16_t neg0 = vtstq_u8(vcombine_u8(vdup_lane_u8(b, 0), vdup_lane_u8(b, 1)), bit);
    const uint8x16_t neg1 = vtstq_u8(vcombine_u8(vdup_lane_u8(b, 2), vdup_lane_u8(b, 3)), bit);
    const int8x16_t g0 = vreinterpretq_s8_u32(vld1q_u32(pts)), g1 = vreinterpretq_s8_u32(vld1q_u32(pts + 4));
    const int8x16_t v0 = vbslq_s8(neg0, vnegq_s8(g0), g0), v1 = vbslq_s8(neg1, vnegq_s8(g1), g1);
    return vaddq_s32(vmulq_n_s32(dot16(v0, vld1q_s8(x)), sc0), vmulq_n_s32(dot16(v1, vld1q_s8(x + 16)), sc1));
}
inline int32x4_t grid_sub_block(const uint32_t* pts, uint32_t signs, int sc, const int8_t* x) {
    return grid_sub_block(pts, signs, sc, sc, x);
}

// IQ3_S and IQ3_XXS: dot_k_decoded's float step with no mins, x.d * (d * sumi - 0), the "- 0"
// exact (IQ3_XXS's d carries its factor 1/4).
float dot_iq3_s(int64_t n, const void* wv, const void* xv) {
    const BlockIQ3_S* w = static_cast<const BlockIQ3_S*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int j = 0; j < 8; ++j) {
            uint32_t pts[8], signs;
            for (int l = 0; l < 8; ++l) pts[l] = iq3s_grid.v[w[i].qs[8 * j + l] | (((w[i].qh[j] >> l) & 1) << 8)];
            std::memcpy(&signs, w[i].signs + 4 * j, 4);
            const int sc = 1 + 2 * ((w[i].scales[j / 2] >> (4 * (j % 2))) & 0x0F);
            acc = vaddq_s32(acc, grid_sub_block(pts, signs, sc, x[i].qs + 32 * j));
        }
        s += x[i].d * (half_to_float(w[i].d) * float(vaddvq_s32(acc)));
    }
    return s;
}

float dot_iq3_xxs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ3_XXS* w = static_cast<const BlockIQ3_XXS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int j = 0; j < 8; ++j) {
            uint32_t pts[8];
            for (int l = 0; l < 8; ++l) pts[l] = iq3xxs_grid.v[w[i].qs[8 * j + l]];
            const uint32_t aux = iq3_xxs_aux(w[i], j);
            acc = vaddq_s32(acc, grid_sub_block(pts, iq2_signs32(aux), 2 * int(aux >> 28) + 1, x[i].qs + 32 * j));
        }
        s += x[i].d * (half_to_float(w[i].d) * 0.25f * float(vaddvq_s32(acc)));
    }
    return s;
}

// IQ2_XXS: as IQ3_XXS with 8-value points (grid words 2 p, 2 p + 1), their indices the bytes of a
// sub-block's first word, d / 8.
float dot_iq2_xxs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ2_XXS* w = static_cast<const BlockIQ2_XXS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int j = 0; j < 8; ++j) {
            uint32_t aux[2], pts[8];
            std::memcpy(aux, w[i].qs + 8 * j, 8);
            for (int l = 0; l < 8; ++l) pts[l] = iq2xxs_grid.v[2 * ((aux[0] >> (8 * (l / 2))) & 0xFF) + l % 2];
            acc = vaddq_s32(acc, grid_sub_block(pts, iq2_signs32(aux[1]), 2 * int(aux[1] >> 28) + 1, x[i].qs + 32 * j));
        }
        s += x[i].d * (half_to_float(w[i].d) * 0.125f * float(vaddvq_s32(acc)));
    }
    return s;
}

// IQ2_XS: point l (qs[l] & 511: grid words 2 p, 2 p + 1) with signs ksigns_iq2xs[qs[l] >> 9], a
// scale 2 s + 1 per 16 values, d / 8.
float dot_iq2_xs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ2_XS* w = static_cast<const BlockIQ2_XS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int j = 0; j < 8; ++j) {
            const uint16_t* q = w[i].qs + 4 * j;
            uint32_t pts[8], signs = 0;
            for (int l = 0; l < 8; ++l) pts[l] = iq2xs_grid.v[2 * (q[l / 2] & 511) + l % 2];
            for (int l = 0; l < 4; ++l) signs |= uint32_t(ksigns_iq2xs[q[l] >> 9]) << (8 * l);
            const int s0 = 2 * (w[i].scales[j] & 0x0F) + 1, s1 = 2 * (w[i].scales[j] >> 4) + 1;
            acc = vaddq_s32(acc, grid_sub_block(pts, signs, s0, s1, x[i].qs + 32 * j));
        }
        s += x[i].d * (half_to_float(w[i].d) * 0.125f * float(vaddvq_s32(acc)));
    }
    return s;
}

// IQ2_S: as IQ2_XS, point l's 10-bit index from qs and qh and its signs a byte.
float dot_iq2_s(int64_t n, const void* wv, const void* xv) {
    const BlockIQ2_S* w = static_cast<const BlockIQ2_S*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int j = 0; j < 8; ++j) {
            uint32_t pts[8], signs;
            for (int l = 0; l < 8; ++l) pts[l] = iq2s_grid.v[2 * iq2_s_point(w[i], 4 * j + l / 2) + l % 2];
            std::memcpy(&signs, w[i].signs + 4 * j, 4);
            const int s0 = 2 * (w[i].scales[j] & 0x0F) + 1, s1 = 2 * (w[i].scales[j] >> 4) + 1;
            acc = vaddq_s32(acc, grid_sub_block(pts, signs, s0, s1, x[i].qs + 32 * j));
        }
        s += x[i].d * (half_to_float(w[i].d) * 0.125f * float(vaddvq_s32(acc)));
    }
    return s;
}

// ---- K-quants x Q8_K: value = d * sc * q - dmin * mn per sub-block, as vec_dot_scalar's
// dot_k_decoded sums them ----

// sum_j mn[j] * (bsums[2j] + bsums[2j + 1]): the min term of Q4_K / Q5_K, whose 8 mins (bytes
// of mn8) each cover two 16-element bsums.
inline int32_t min_term(uint64_t mn8, const int16_t* bsums) {
    const uint16x8_t mn = vmovl_u8(vcreate_u8(mn8));
    const int32x4_t m0 = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(mn)));
    const int32x4_t m1 = vreinterpretq_s32_u32(vmovl_high_u16(mn));
    const int32x4_t pairs0 = vpaddlq_s16(vld1q_s16(bsums)), pairs1 = vpaddlq_s16(vld1q_s16(bsums + 8));
    return vaddvq_s32(vmlaq_s32(vmulq_s32(pairs0, m0), pairs1, m1));
}

template <bool Q5>
float dot_q45_k(int64_t n, const void* wv, const void* xv) {
    using WB = std::conditional_t<Q5, BlockQ5_K, BlockQ4_K>;
    const WB* w = static_cast<const WB*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const uint8x16_t m4 = vdupq_n_u8(0x0F), sixteen = vdupq_n_u8(0x10);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        uint64_t sc8, mn8;
        unpack_scales_k4(w[i].scales, sc8, mn8);
        uint8_t sc[8];
        std::memcpy(sc, &sc8, 8);
        uint8x16_t qh0, qh1;
        if constexpr (Q5) {
            qh0 = vld1q_u8(w[i].qh);
            qh1 = vld1q_u8(w[i].qh + 16);
        }
        // chunk c (32 bytes of qs): sub-block 2c in the low nibbles, 2c + 1 in the high ones
        int32x4_t acc = vdupq_n_s32(0);
        for (int c = 0; c < 4; ++c) {
            const uint8x16_t q0 = vld1q_u8(w[i].qs + 32 * c), q1 = vld1q_u8(w[i].qs + 32 * c + 16);
            uint8x16_t lo0 = vandq_u8(q0, m4), lo1 = vandq_u8(q1, m4);
            uint8x16_t hi0 = vshrq_n_u8(q0, 4), hi1 = vshrq_n_u8(q1, 4);
            if constexpr (Q5) {   // bit 4 of element l of sub-block j: bit j of qh[l]
                const uint8x16_t b0 = vdupq_n_u8(uint8_t(1 << (2 * c))), b1 = vdupq_n_u8(uint8_t(2 << (2 * c)));
                lo0 = vorrq_u8(lo0, vandq_u8(vtstq_u8(qh0, b0), sixteen));
                lo1 = vorrq_u8(lo1, vandq_u8(vtstq_u8(qh1, b0), sixteen));
                hi0 = vorrq_u8(hi0, vandq_u8(vtstq_u8(qh0, b1), sixteen));
                hi1 = vorrq_u8(hi1, vandq_u8(vtstq_u8(qh1, b1), sixteen));
            }
            const int8_t* xq = x[i].qs + 64 * c;
            const int32x4_t p0 = vaddq_s32(dot16(vreinterpretq_s8_u8(lo0), vld1q_s8(xq)),
                                           dot16(vreinterpretq_s8_u8(lo1), vld1q_s8(xq + 16)));
            const int32x4_t p1 = vaddq_s32(dot16(vreinterpretq_s8_u8(hi0), vld1q_s8(xq + 32)),
                                           dot16(vreinterpretq_s8_u8(hi1), vld1q_s8(xq + 48)));
            acc = vmlaq_n_s32(vmlaq_n_s32(acc, p0, sc[2 * c]), p1, sc[2 * c + 1]);
        }
        const int32_t sumi = vaddvq_s32(acc), summ = min_term(mn8, x[i].bsums);
        s += x[i].d * (half_to_float(w[i].d) * float(sumi) - half_to_float(w[i].dmin) * float(summ));
    }
    return s;
}

float dot_q6_k(int64_t n, const void* wv, const void* xv) {
    const BlockQ6_K* w = static_cast<const BlockQ6_K*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x03);
    const int8x16_t offset = vdupq_n_s8(32);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int32x4_t acc = vdupq_n_s32(0);
        // half h (128 weights): element 128h + 32k + l takes nibble k >> 1 of ql[64h + 32(k & 1) + l]
        // and bits 2k, 2k + 1 of qh[32h + l]; its 16-element group is 8h + 2k + l / 16
        for (int h = 0; h < 2; ++h) {
            const uint8_t* ql = w[i].ql + 64 * h;
            const uint8x16_t qh[2] = {vld1q_u8(w[i].qh + 32 * h), vld1q_u8(w[i].qh + 32 * h + 16)};
            for (int k = 0; k < 4; ++k) {
                const int8_t* xq = x[i].qs + 128 * h + 32 * k;
                const int g = 8 * h + 2 * k;
                for (int half = 0; half < 2; ++half) {
                    const uint8x16_t l = vld1q_u8(ql + 32 * (k & 1) + 16 * half);
                    const uint8x16_t lo = k < 2 ? vandq_u8(l, m4) : vshrq_n_u8(l, 4);
                    const uint8x16_t hi = vandq_u8(vshlq_u8(qh[half], vdupq_n_s8(int8_t(-2 * k))), m2);
                    const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4))), offset);
                    acc = vmlaq_n_s32(acc, dot16(q, vld1q_s8(xq + 16 * half)), w[i].scales[g + half]);
                }
            }
        }
        // the scalar's min term is 0 * 0 for Q6_K, and subtracting +0 leaves every value as it is
        s += x[i].d * (half_to_float(w[i].d) * float(vaddvq_s32(acc)));
    }
    return s;
}

// ---- F32 / F16 / BF16 weights x F32 ----

template <int Kind>   // 0: F32, 1: F16, 2: BF16
inline float32x4_t load_weights4(const void* w, int64_t i) {
    if constexpr (Kind == 0) return vld1q_f32(static_cast<const float*>(w) + i);
    const uint16x4_t h = vld1_u16(static_cast<const uint16_t*>(w) + i);
    if constexpr (Kind == 1) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    else return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

template <int Kind>
inline float weight_at(const void* w, int64_t i) {
    if constexpr (Kind == 0) return static_cast<const float*>(w)[i];
    const uint16_t h = static_cast<const uint16_t*>(w)[i];
    if constexpr (Kind == 1) return half_to_float(h);
    else return bf16_to_float(h);
}

// Four independent accumulators of 4 lanes hide the FMA latency.
template <int Kind>
float dot_float(int64_t n, const void* w, const void* xv) {
    const float* x = static_cast<const float*>(xv);
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; ++k)
            acc[k] = vfmaq_f32(acc[k], load_weights4<Kind>(w, i + 4 * k), vld1q_f32(x + i + 4 * k));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; ++i) s += weight_at<Kind>(w, i) * x[i];
    return s;
}

}  // namespace

VecDotFn vec_dot_neon(GGMLType type) {
    switch (type) {
        case GGMLType::F32: return dot_float<0>;
        case GGMLType::F16: return dot_float<1>;
        case GGMLType::BF16: return dot_float<2>;
        case GGMLType::Q4_0: return dot_legacy<Legacy::q4_0>;
        case GGMLType::Q4_1: return dot_legacy<Legacy::q4_1>;
        case GGMLType::Q5_0: return dot_legacy<Legacy::q5_0>;
        case GGMLType::Q5_1: return dot_legacy<Legacy::q5_1>;
        case GGMLType::Q8_0: return dot_legacy<Legacy::q8_0>;
        case GGMLType::Q2_K:
        case GGMLType::Q3_K: return vec_dot_q2_q3_neon(type);
        case GGMLType::Q4_K: return dot_q45_k<false>;
        case GGMLType::Q5_K: return dot_q45_k<true>;
        case GGMLType::Q6_K: return dot_q6_k;
        case GGMLType::MXFP4: return dot_table<BlockMXFP4>;
        case GGMLType::IQ4_NL: return dot_table<BlockIQ4_NL>;
        case GGMLType::IQ4_XS: return dot_iq4_xs;
        case GGMLType::IQ3_S: return dot_iq3_s;
        case GGMLType::IQ3_XXS: return dot_iq3_xxs;
        case GGMLType::IQ2_XXS: return dot_iq2_xxs;
        case GGMLType::IQ2_XS: return dot_iq2_xs;
        case GGMLType::IQ2_S: return dot_iq2_s;
        default: return vec_dot_low_bit_neon(type);
    }
}

}  // namespace ember
#else
namespace ember {
VecDotFn vec_dot_neon(GGMLType) { return nullptr; }
}  // namespace ember
#endif
