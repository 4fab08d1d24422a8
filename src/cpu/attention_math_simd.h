// The SIMD attention arithmetic (attention_math.h), written once on a 16-float type:
// attention_math_avx2.cpp and attention_math_avx512.cpp include it under their ISA flags,
// attention_math_neon.cpp on ARM64. Lane l of a vector holds what iteration l of the scalar loop
// computes, with the same operations in the same order.
#pragma once
#if defined(__aarch64__)
#include <arm_neon.h>
#else
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
#include "cpu/expf_avx512.h"
#include "cpu/transpose16_avx512.h"
#elif defined(__AVX2__)
#include "cpu/expf_avx2.h"
#endif

#include <cmath>
#include <cstring>

#include "cpu/attention_math.h"

namespace ember {
namespace attention_simd {
namespace {   // each including file gets its own copies, built for its ISA

// 16 floats: one zmm, two ymm under AVX2 (GCC's own 64-byte vectors went through the stack
// there), or four q registers on NEON. Operators are single IEEE operations, so lane l computes
// what the scalar loop does.
#if defined(__aarch64__)
struct v16 {
    float32x4_t r[4];
};
inline v16 zero() { return {{vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)}}; }
inline v16 load(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
inline void store(float* p, v16 a) {
    for (int k = 0; k < 4; ++k) vst1q_f32(p + 4 * k, a.r[k]);
}
inline v16 operator+(v16 a, v16 b) {
    return {
        {vaddq_f32(a.r[0], b.r[0]), vaddq_f32(a.r[1], b.r[1]), vaddq_f32(a.r[2], b.r[2]), vaddq_f32(a.r[3], b.r[3])}};
}
inline v16 operator*(v16 a, float s) {
    return {{vmulq_n_f32(a.r[0], s), vmulq_n_f32(a.r[1], s), vmulq_n_f32(a.r[2], s), vmulq_n_f32(a.r[3], s)}};
}
inline v16 load_fill(float s) { return {{vdupq_n_f32(s), vdupq_n_f32(s), vdupq_n_f32(s), vdupq_n_f32(s)}}; }
// Lane-wise x > m ? x : m, as maxps does: FMAX (vmaxq_f32) would return a NaN operand.
inline v16 vmax(v16 x, v16 m) {
    v16 y;
    for (int k = 0; k < 4; ++k) y.r[k] = vbslq_f32(vcgtq_f32(x.r[k], m.r[k]), x.r[k], m.r[k]);
    return y;
}
// f16 <-> f32 by FCVTL / FCVTN: round to nearest even (the default FPCR mode), subnormals kept,
// overflow to inf, as float_to_half / half_to_float.
inline v16 from_f16(const uint16_t* p) {
    v16 y;
    for (int k = 0; k < 4; ++k) y.r[k] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * k)));
    return y;
}
inline v16 round_f16(v16 a) {
    for (int k = 0; k < 4; ++k) a.r[k] = vcvt_f32_f16(vcvt_f16_f32(a.r[k]));
    return a;
}
inline void store_f16(uint16_t* p, v16 a) {
    for (int k = 0; k < 4; ++k) vst1_u16(p + 4 * k, vreinterpret_u16_f16(vcvt_f16_f32(a.r[k])));
}
#elif defined(__AVX512F__)
struct v16 {
    __m512 z;
};
inline v16 zero() { return {_mm512_setzero_ps()}; }
inline v16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store(float* p, v16 a) { _mm512_storeu_ps(p, a.z); }
inline v16 operator+(v16 a, v16 b) { return {_mm512_add_ps(a.z, b.z)}; }
inline v16 operator*(v16 a, float s) { return {_mm512_mul_ps(a.z, _mm512_set1_ps(s))}; }
inline v16 load_fill(float s) { return {_mm512_set1_ps(s)}; }
inline v16 vmax(v16 x, v16 m) { return {_mm512_max_ps(x.z, m.z)}; }
// f16 <-> f32 (F16C, round to nearest even: the scalar float_to_half's result)
inline v16 from_f16(const uint16_t* p) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline v16 round_f16(v16 a) {
    return {_mm512_cvtph_ps(_mm512_cvtps_ph(a.z, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))};
}
inline void store_f16(uint16_t* p, v16 a) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(a.z, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#else
struct v16 {
    __m256 lo, hi;
};
inline v16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline v16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store(float* p, v16 a) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
}
inline v16 operator+(v16 a, v16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline v16 operator*(v16 a, float s) {
    const __m256 b = _mm256_set1_ps(s);
    return {_mm256_mul_ps(a.lo, b), _mm256_mul_ps(a.hi, b)};
}
inline v16 load_fill(float s) { return {_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
inline v16 vmax(v16 x, v16 m) { return {_mm256_max_ps(x.lo, m.lo), _mm256_max_ps(x.hi, m.hi)}; }
inline v16 from_f16(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline v16 round_f16(v16 a) {
    return {_mm256_cvtph_ps(_mm256_cvtps_ph(a.lo, _MM_FROUND_TO_NEAREST_INT)),
            _mm256_cvtph_ps(_mm256_cvtps_ph(a.hi, _MM_FROUND_TO_NEAREST_INT))};
}
inline void store_f16(uint16_t* p, v16 a) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a.lo, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(a.hi, _MM_FROUND_TO_NEAREST_INT));
}
#endif

// Four key groups at a time: four independent sums hide the add latency; each lane's sum
// still runs over i in order.
inline void scores(const float* q, const float* kt, int32_t D, int32_t n_groups, float scale, float* prob) {
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

inline void scale_round(const float* x, int32_t n, float mul, bool to_f16, float* y) {
    int32_t j = 0;
    for (; j + 16 <= n; j += 16) {
        const v16 v = load(x + j) * mul;
        store(y + j, to_f16 ? round_f16(v) : v);
    }
    float tail[16] = {};
    std::memcpy(tail, x + j, sizeof(float) * (n - j));
    const v16 v = load(tail) * mul;
    store(tail, to_f16 ? round_f16(v) : v);
    std::memcpy(y + j, tail, sizeof(float) * (n - j));
}

// D % 16 == 0. Up to 64 output elements (four vectors) per pass over the positions.
inline void weighted_sum(const float* w, const float* v, int32_t D, int32_t len, float* o) {
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

// Rows this far ahead of the one being summed are fetched into cache: a decode step reads each
// sequence's values once, from a pool larger than the caches, and the loads would wait on memory.
constexpr int32_t kPrefetchRows = 8;

// Vectors of a row summed per pass over the positions: as many as keep the NH * C sums and the C
// converted vectors in registers (32 zmm; AVX2's 16 ymm and NEON's 32 q registers hold one
// two- or four-register v16 per head).
#if defined(__AVX512F__)
constexpr int kSumVectors = 4;
#else
constexpr int kSumVectors = 1;
#endif

// NH heads (at most 4) over C * 16 outputs: the row's C vectors are converted once and added into
// the NH * C sums (independent chains, which also hide the add latency). Each lane is one output
// element, summed over positions in order.
template <int NH, int C>
inline void weighted_sum_f16_chunk(const float* w, int64_t w_stride, const uint16_t* const* rows, int32_t c,
                                   int32_t len, float* o, int64_t o_stride) {
    // (fully unrolled, or the sums live on the stack)
    v16 a[NH][C];
#pragma GCC unroll 4
    for (int j = 0; j < NH; ++j)
#pragma GCC unroll 4
        for (int k = 0; k < C; ++k) a[j][k] = zero();
    for (int32_t p = 0; p < len; ++p) {
        if (p + kPrefetchRows < len) {
            const char* ahead = reinterpret_cast<const char*>(rows[p + kPrefetchRows] + c);
#pragma GCC unroll 2
            for (int k = 0; k < C; k += 2) __builtin_prefetch(ahead + 64 * (k / 2));   // 2 vectors a line
        }
        v16 x[C];
#pragma GCC unroll 4
        for (int k = 0; k < C; ++k) x[k] = from_f16(rows[p] + c + 16 * k);
#pragma GCC unroll 4
        for (int j = 0; j < NH; ++j) {
            const float wp = w[j * w_stride + p];
#pragma GCC unroll 4
            for (int k = 0; k < C; ++k) a[j][k] = a[j][k] + x[k] * wp;
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NH; ++j)
#pragma GCC unroll 4
        for (int k = 0; k < C; ++k) store(o + j * o_stride + c + 16 * k, a[j][k]);
}

template <int NH>
inline void weighted_sum_f16_heads(const float* w, int64_t w_stride, const uint16_t* const* rows, int32_t D,
                                   int32_t len, float* o, int64_t o_stride) {
    int32_t c = 0;
    for (; c + 16 * kSumVectors <= D; c += 16 * kSumVectors)
        weighted_sum_f16_chunk<NH, kSumVectors>(w, w_stride, rows, c, len, o, o_stride);
    for (; c < D; c += 16) weighted_sum_f16_chunk<NH, 1>(w, w_stride, rows, c, len, o, o_stride);
}

inline void weighted_sum_f16(const float* w, int64_t w_stride, int32_t n_heads, const uint16_t* const* rows, int32_t D,
                             int32_t len, float* o, int64_t o_stride) {
    for (int32_t h = 0; h < n_heads; h += 4) {
        const float* wh = w + h * w_stride;
        float* oh = o + h * o_stride;
        switch (n_heads - h) {
            case 1: weighted_sum_f16_heads<1>(wh, w_stride, rows, D, len, oh, o_stride); break;
            case 2: weighted_sum_f16_heads<2>(wh, w_stride, rows, D, len, oh, o_stride); break;
            case 3: weighted_sum_f16_heads<3>(wh, w_stride, rows, D, len, oh, o_stride); break;
            default: weighted_sum_f16_heads<4>(wh, w_stride, rows, D, len, oh, o_stride); break;
        }
    }
}

// dst[j] = st(ld(src)) 16 values at a time, the tail through zero-padded copies.
template <class In, class Out, class Load, class Store>
inline void convert_row(const In* src, int32_t n, Out* dst, Load ld, Store st) {
    int32_t j = 0;
    for (; j + 16 <= n; j += 16) st(dst + j, ld(src + j));
    In tail[16] = {};
    std::memcpy(tail, src + j, sizeof(In) * (n - j));
    Out out[16];
    st(out, ld(tail));
    std::memcpy(dst + j, out, sizeof(Out) * (n - j));
}

inline void f16_to_f32(const uint16_t* src, int32_t n, float* dst) {
    convert_row(src, n, dst, [](const uint16_t* p) { return from_f16(p); }, [](float* p, v16 a) { store(p, a); });
}

inline void f32_to_f16(const float* src, int32_t n, uint16_t* dst) {
    convert_row(src, n, dst, [](const float* p) { return load(p); }, [](uint16_t* p, v16 a) { store_f16(p, a); });
}

#if defined(__AVX512F__)
inline void exp_shifted(float* x, int32_t n, float m) {
    const __m512 mv = _mm512_set1_ps(m);
    int32_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv)));
    const __mmask16 tail = __mmask16((1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(x + j, tail, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + j), mv)));
}
#elif defined(__AVX2__)
inline void exp_shifted(float* x, int32_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, expf8_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
    exp_shifted_scalar(x + j, n - j, m);
}
#else
// No vector expf with std::exp's bits at this level.
inline void exp_shifted(float* x, int32_t n, float m) { exp_shifted_scalar(x, n, m); }
#endif

// max(x, m) keeps m where x is NaN (the second operand wins), as the scalar comparison does.
inline float max(const float* x, int32_t n) {
    v16 m = load_fill(-INFINITY);
    int32_t j = 0;
    for (; j + 16 <= n; j += 16) m = vmax(load(x + j), m);
    float tail[16];
    for (int l = 0; l < 16; ++l) tail[l] = j + l < n ? x[j + l] : -INFINITY;
    m = vmax(load(tail), m);
    float lanes[16];
    store(lanes, m);
    float r = -INFINITY;
    for (int l = 0; l < 16; ++l) r = lanes[l] > r ? lanes[l] : r;
    return r;
}

// One transposed key group (attention_math.h): 16 f16 rows converted and transposed in
// registers. D % 16 == 0.
#if defined(__aarch64__)
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

// 8 columns of rows h..h+3 at a time, converted then transposed as two 4x4 blocks.
inline void gather_keys16_f16(const uint16_t* rows, int64_t row_stride, int32_t D, float* kt) {
    for (int32_t c = 0; c < D; c += 8)
        for (int h = 0; h < 16; h += 4) {
            float32x4_t lo[4], hi[4];
            for (int l = 0; l < 4; ++l) {
                const float16x8_t r = vreinterpretq_f16_u16(vld1q_u16(rows + (h + l) * row_stride + c));
                lo[l] = vcvt_f32_f16(vget_low_f16(r));
                hi[l] = vcvt_high_f32_f16(r);
            }
            transpose4(lo);
            transpose4(hi);
            for (int j = 0; j < 4; ++j) {
                vst1q_f32(kt + (int64_t)(c + j) * 16 + h, lo[j]);
                vst1q_f32(kt + (int64_t)(c + 4 + j) * 16 + h, hi[j]);
            }
        }
}
#elif defined(__AVX512F__)
inline void gather_keys16_f16(const uint16_t* rows, int64_t row_stride, int32_t D, float* kt) {
    for (int32_t c = 0; c < D; c += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int l = 0; l < 16; ++l)
            r[l] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + l * row_stride + c)));
        transpose16(r);
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) _mm512_storeu_ps(kt + (int64_t)(c + j) * 16, r[j]);
    }
}
#else
// r[j] = column j of the 8x8 matrix whose rows were r[0..8).
inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int a = 0; a < 8; a += 2) {
        t[a] = _mm256_unpacklo_ps(r[a], r[a + 1]);
        t[a + 1] = _mm256_unpackhi_ps(r[a], r[a + 1]);
    }
#pragma GCC unroll 2
    for (int a = 0; a < 8; a += 4) {   // u[a + j], 128-bit lane k: rows a..a+3 at column 4k + j
        u[a] = _mm256_shuffle_ps(t[a], t[a + 2], 0x44);
        u[a + 1] = _mm256_shuffle_ps(t[a], t[a + 2], 0xEE);
        u[a + 2] = _mm256_shuffle_ps(t[a + 1], t[a + 3], 0x44);
        u[a + 3] = _mm256_shuffle_ps(t[a + 1], t[a + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

inline void gather_keys16_f16(const uint16_t* rows, int64_t row_stride, int32_t D, float* kt) {
    for (int32_t c = 0; c < D; c += 8)
#pragma GCC unroll 2
        for (int h = 0; h < 16; h += 8) {   // rows h..h+7: lanes h..h+7 of each column
            __m256 r[8];
#pragma GCC unroll 8
            for (int l = 0; l < 8; ++l)
                r[l] = _mm256_cvtph_ps(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + (h + l) * row_stride + c)));
            transpose8(r);
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) _mm256_storeu_ps(kt + (int64_t)(c + j) * 16 + h, r[j]);
        }
}
#endif

}  // namespace
}  // namespace attention_simd
}  // namespace ember
