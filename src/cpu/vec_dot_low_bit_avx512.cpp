// AVX-512 (F, BW, VL, DQ, VNNI) dot products of the ternary, 1-bit and NVFP4 types: as their AVX2
// kernels (vec_dot_low_bit_avx2.cpp) with 64 weight bytes a step (two sub-blocks, or a whole NVFP4
// block), s16 pair sums times the integer scales through vpdpwssd.
#include <immintrin.h>

#include <cstring>

#include "cpu/isa_kernels.h"
#include "quant/decode.h"

namespace ember {
namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// acc + the s16 pair sums of signed weights v (|v| <= 127) with activations x, times sc16 (each s16
// lane's scale): |x| against v carrying x's sign (a Q8_K -128 stays exact as the unsigned 128).
inline __m512i dot_scaled(__m512i acc, __m512i v, __m512i x, __m512i sc16) {
    const __m512i sv = _mm512_mask_sub_epi8(v, _mm512_movepi8_mask(x), _mm512_setzero_si512(), v);
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(_mm512_abs_epi8(x), sv), sc16);
}

// Base-3 digit bytes q as -1, 0, 1: -1 + [q > 85] + [q > 170] (unsigned).
inline __m512i ternary(__m512i q) {
    const __m512i one = _mm512_set1_epi8(1);
    __m512i v = _mm512_set1_epi8(-1);
    v = _mm512_mask_add_epi8(v, _mm512_cmpgt_epu8_mask(q, _mm512_set1_epi8(85)), v, one);
    return _mm512_mask_add_epi8(v, _mm512_cmpgt_epu8_mask(q, _mm512_set1_epi8(char(170))), v, one);
}
inline __m512i times3(__m512i q) { return _mm512_add_epi8(_mm512_add_epi8(q, q), q); }
inline __m256i times3(__m256i q) { return _mm256_add_epi8(_mm256_add_epi8(q, q), q); }

// TQ1_0: digits k, k + 1 of qs[0..31] side by side (values 32 k .. 32 k + 63), then digit 4 beside
// digits 0, 1 of qs[32..47] (values 128..191), then its digits 2, 3 and 4 beside qh's (192..255).
float dot_tq1_0(int64_t n, const void* wv, const void* xv) {
    const BlockTQ1_0* w = static_cast<const BlockTQ1_0*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const __m512i ones = _mm512_set1_epi16(1);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const int8_t* xq = x[i].qs;
        const __m256i a = load256(w[i].qs);
        const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].qs + 32)));
        const __m256i b01 = _mm256_blend_epi32(b, times3(b), 0xF0), b23 = times3(times3(b01));
        const __m256i b4 = times3(times3(b23));
        alignas(16) uint8_t h[16];
        for (int k = 0, m = 1; k < 4; ++k, m *= 3)
            for (int j = 0; j < 4; ++j) h[4 * k + j] = uint8_t(w[i].qh[j] * m);
        const __m512i a01 = join(a, times3(a)), a23 = times3(times3(a01));
        const __m256i a4 = _mm512_castsi512_si256(times3(times3(a23)));
        const __m512i v4 = join(b23,
                                _mm256_inserti128_si256(b4, _mm_load_si128(reinterpret_cast<const __m128i*>(h)), 1));
        __m512i sumi = dot_scaled(_mm512_setzero_si512(), ternary(a01), load512(xq), ones);
        sumi = dot_scaled(sumi, ternary(a23), load512(xq + 64), ones);
        sumi = dot_scaled(sumi, ternary(join(a4, b01)), load512(xq + 128), ones);
        sumi = dot_scaled(sumi, ternary(v4), load512(xq + 192), ones);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// TQ2_0: the 2-bit codes at shift 2 s of both 32-byte chunks (values 32 s.., 128 + 32 s..).
float dot_tq2_0(int64_t n, const void* wv, const void* xv) {
    const BlockTQ2_0* w = static_cast<const BlockTQ2_0*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const __m512i three = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1), ones = _mm512_set1_epi16(1);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const __m512i q = load512(w[i].qs);
        __m512i sumi = _mm512_setzero_si512();
        for (int s = 0; s < 4; ++s) {
            const __m512i v = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(q, 2 * s), three), one);
            sumi = dot_scaled(sumi, v, join(load256(x[i].qs + 32 * s), load256(x[i].qs + 128 + 32 * s)), ones);
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// The IQ1 types, two sub-blocks a step: their 8 points (16 grid words of int8 -1, 0, 1) gathered, as
// 8 value + shift (shift: a byte a value), pair sums times sc16.
inline __m512i iq1_sub_blocks(__m512i acc, const uint32_t* p, __m512i shift, __m512i sc16, const int8_t* x) {
    alignas(64) int idx[16];
    for (int l = 0; l < 8; ++l) {
        idx[2 * l] = int(2 * p[l]);
        idx[2 * l + 1] = int(2 * p[l] + 1);
    }
    const __m512i g = _mm512_i32gather_epi32(_mm512_load_si512(idx), iq1s_grid.v, 4);
    const __m512i g2 = _mm512_add_epi8(g, g), g4 = _mm512_add_epi8(g2, g2);
    return dot_scaled(acc, _mm512_add_epi8(_mm512_add_epi8(g4, g4), shift), load512(x), sc16);
}

float dot_iq1_s(int64_t n, const void* wv, const void* xv) {
    const BlockIQ1_S* w = static_cast<const BlockIQ1_S*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            uint32_t p[8];
            int sh[2], sc[2];
            for (int t = 0; t < 2; ++t) {
                const int j = 2 * c + t;
                const uint32_t h = w[i].qh[j];
                for (int l = 0; l < 4; ++l) p[4 * t + l] = w[i].qs[4 * j + l] | (((h >> (3 * l)) & 7) << 8);
                sh[t] = h & 0x8000 ? -1 : 1;
                sc[t] = 2 * int((h >> 12) & 7) + 1;
            }
            const __m512i shift = join(_mm256_set1_epi8(char(sh[0])), _mm256_set1_epi8(char(sh[1])));
            const __m512i sc16 = join(_mm256_set1_epi16(int16_t(sc[0])), _mm256_set1_epi16(int16_t(sc[1])));
            sumi = iq1_sub_blocks(sumi, p, shift, sc16, x[i].qs + 64 * c);
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * 0.125f * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

float dot_iq1_m(int64_t n, const void* wv, const void* xv) {
    const BlockIQ1_M* w = static_cast<const BlockIQ1_M*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        uint16_t sw[4];
        iq1_m_scale_words(w[i], sw);
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            uint32_t p[8];
            alignas(64) int64_t sh[8];
            alignas(64) int16_t sc[32];
            for (int l = 0; l < 8; ++l) {
                const int pt = 8 * c + l;
                const uint32_t nib = (w[i].qh[pt / 2] >> (4 * (pt % 2))) & 15;
                p[l] = w[i].qs[pt] | ((nib & 7) << 8);
                sh[l] = nib & 8 ? -1 : 0x0101010101010101LL;
            }
            // scale g (16 values) of the block is bits 3 (g % 4) of word g / 4; lanes 8 q .. of quarter q
            for (int q = 0; q < 4; ++q) {
                const int g = 4 * c + q;
                for (int l = 0; l < 8; ++l) sc[8 * q + l] = int16_t(2 * ((sw[g / 4] >> (3 * (g % 4))) & 7) + 1);
            }
            sumi = iq1_sub_blocks(sumi, p, _mm512_load_si512(sh), _mm512_load_si512(sc), x[i].qs + 64 * c);
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(iq1_m_d(sw)) * 0.125f * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// NVFP4 x Q8_0: a block (two Q8_0 blocks) a vector, its nibbles in element order (each sub-block's 8
// low nibbles, then its 8 high ones), lane quarter s sub-block s with its own scale.
float dot_nvfp4(int64_t n, const void* wv, const void* xv) {
    const BlockNVFP4* w = static_cast<const BlockNVFP4*>(wv);
    const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_mxfp4)));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m512i ones = _mm512_set1_epi16(1);
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_NVFP4; ++i) {
        __m128i part[4];
        for (int h = 0; h < 2; ++h) {
            const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].qs + 16 * h));
            const __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
            part[2 * h] = _mm_unpacklo_epi64(lo, hi);
            part[2 * h + 1] = _mm_unpackhi_epi64(lo, hi);
        }
        const __m512i codes = join(_mm256_setr_m128i(part[0], part[1]), _mm256_setr_m128i(part[2], part[3]));
        const __m512i xv = join(load256(x[2 * i].qs), load256(x[2 * i + 1].qs));
        const __m512i p = dot_scaled(_mm512_setzero_si512(), _mm512_shuffle_epi8(table, codes), xv, ones);
        const float dy0 = h2f(x[2 * i].d), dy1 = h2f(x[2 * i + 1].d);
        const __m128 d = _mm_setr_ps(ue4m3_half(w[i].d[0]) * dy0, ue4m3_half(w[i].d[1]) * dy0,
                                     ue4m3_half(w[i].d[2]) * dy1, ue4m3_half(w[i].d[3]) * dy1);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(quarter, _mm512_castps128_ps512(d)), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

}  // namespace

VecDotFn vec_dot_low_bit_avx512(GGMLType type) {
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
