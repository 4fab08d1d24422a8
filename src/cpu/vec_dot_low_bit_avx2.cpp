// AVX2 dot products of the ternary, 1-bit and NVFP4 types: TQ1_0, TQ2_0, IQ1_S, IQ1_M x Q8_K and
// NVFP4 x Q8_0. Each forms 32 signed weight bytes a step (the K-quant form of decode_low_bit.h) and
// sums their s16 pair products times the integer scales, exact; one float step a block.
#include <immintrin.h>

#include <cstring>

#include "cpu/isa_kernels.h"
#include "cpu/simd_avx2.h"
#include "quant/decode.h"

namespace ember {
namespace {

using namespace avx2;

// s16 pair sums of signed weights v (|v| <= 127) with activations x: |x| against v carrying x's sign,
// so that a Q8_K -128 stays exact as the unsigned 128.
inline __m256i pairs(__m256i v, const int8_t* x) {
    const __m256i xv = load256(x);
    return _mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(v, xv));
}
inline __m256i pair_sums(__m256i v, const int8_t* x) { return _mm256_madd_epi16(pairs(v, x), _mm256_set1_epi16(1)); }

// Base-3 digit bytes q (a TQ1_0 byte times 3^k, mod 256) as -1, 0, 1: ((q * 3) >> 8) - 1, that is
// -1 + [q > 85] + [q > 170].
inline __m256i ternary(__m256i q) {
    const __m256i flip = _mm256_set1_epi8(char(0x80)), u = _mm256_xor_si256(q, flip);
    const __m256i c1 = _mm256_cmpgt_epi8(u, _mm256_set1_epi8(char(85 ^ 0x80)));
    const __m256i c2 = _mm256_cmpgt_epi8(u, _mm256_set1_epi8(char(170 ^ 0x80)));
    return _mm256_sub_epi8(_mm256_sub_epi8(_mm256_set1_epi8(-1), c1), c2);
}
inline __m256i times3(__m256i q) { return _mm256_add_epi8(_mm256_add_epi8(q, q), q); }

float dot_tq1_0(int64_t n, const void* wv, const void* xv) {
    const BlockTQ1_0* w = static_cast<const BlockTQ1_0*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const int8_t* xq = x[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        // qs[0..31]: digit k is values 32 k .. 32 k + 31
        __m256i q = load256(w[i].qs);
        for (int k = 0; k < 5; ++k, q = times3(q)) sumi = _mm256_add_epi32(sumi, pair_sums(ternary(q), xq + 32 * k));
        // qs[32..47]: digits k, k + 1 side by side are values 160 + 16 k .. 160 + 16 k + 31
        const __m128i q16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].qs + 32));
        const __m256i b = _mm256_broadcastsi128_si256(q16);
        __m256i p = _mm256_blend_epi32(b, times3(b), 0xF0);
        for (int k = 0; k < 4; k += 2, p = times3(times3(p)))
            sumi = _mm256_add_epi32(sumi, pair_sums(ternary(p), xq + 160 + 16 * k));
        // digit 4 of qs[32..47] (values 224..239) beside qh's 4 digits (values 240 + 4 k + j)
        alignas(16) uint8_t h[16];
        for (int k = 0, m = 1; k < 4; ++k, m *= 3)
            for (int j = 0; j < 4; ++j) h[4 * k + j] = uint8_t(w[i].qh[j] * m);
        const __m256i last = _mm256_inserti128_si256(p, _mm_load_si128(reinterpret_cast<const __m128i*>(h)), 1);
        sumi = _mm256_add_epi32(sumi, pair_sums(ternary(last), xq + 224));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return hsum_ps(acc);
}

float dot_tq2_0(int64_t n, const void* wv, const void* xv) {
    const BlockTQ2_0* w = static_cast<const BlockTQ2_0*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
            const __m256i q = load256(w[i].qs + 32 * c);
            for (int s = 0; s < 4; ++s) {
                const __m256i v = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), three), one);
                sumi = _mm256_add_epi32(sumi, pair_sums(v, x[i].qs + 128 * c + 32 * s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return hsum_ps(acc);
}

// The IQ1 types: a sub-block's 4 points (8 grid words, int8 values -1, 0, 1) gathered, as 8 value +
// shift (shift: a byte a value), their pair sums times sc16 (the scale of each s16 lane).
inline __m256i iq1_sub_block(const uint32_t* p, __m256i shift, __m256i sc16, const int8_t* x) {
    const int* grid = reinterpret_cast<const int*>(iq1s_grid.v);
    const __m256i idx = _mm256_setr_epi32(int(2 * p[0]), int(2 * p[0] + 1), int(2 * p[1]), int(2 * p[1] + 1),
                                          int(2 * p[2]), int(2 * p[2] + 1), int(2 * p[3]), int(2 * p[3] + 1));
    const __m256i g = _mm256_i32gather_epi32(grid, idx, 4);
    const __m256i v = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), shift);
    return _mm256_madd_epi16(pairs(v, x), sc16);
}

float dot_iq1_s(int64_t n, const void* wv, const void* xv) {
    const BlockIQ1_S* w = static_cast<const BlockIQ1_S*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const uint32_t h = w[i].qh[j];
            uint32_t p[4];
            for (int l = 0; l < 4; ++l) p[l] = w[i].qs[4 * j + l] | (((h >> (3 * l)) & 7) << 8);
            const __m256i shift = _mm256_set1_epi8(h & 0x8000 ? -1 : 1);
            const __m256i sc = _mm256_set1_epi16(int16_t(2 * ((h >> 12) & 7) + 1));
            sumi = _mm256_add_epi32(sumi, iq1_sub_block(p, shift, sc, x[i].qs + 32 * j));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * 0.125f * x[i].d), acc);
    }
    return hsum_ps(acc);
}

float dot_iq1_m(int64_t n, const void* wv, const void* xv) {
    const BlockIQ1_M* w = static_cast<const BlockIQ1_M*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        uint16_t sw[4];
        iq1_m_scale_words(w[i], sw);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            uint32_t p[4];
            int64_t sh[4];
            for (int l = 0; l < 4; ++l) {
                const uint32_t nib = (w[i].qh[2 * j + l / 2] >> (4 * (l % 2))) & 15;
                p[l] = w[i].qs[4 * j + l] | ((nib & 7) << 8);
                sh[l] = nib & 8 ? -1 : 0x0101010101010101LL;
            }
            const int s0 = 2 * ((sw[j / 2] >> (6 * (j % 2))) & 7) + 1,
                      s1 = 2 * ((sw[j / 2] >> (6 * (j % 2) + 3)) & 7) + 1;
            const __m256i sc = _mm256_inserti128_si256(_mm256_set1_epi16(int16_t(s0)), _mm_set1_epi16(int16_t(s1)), 1);
            sumi = _mm256_add_epi32(
                sumi, iq1_sub_block(p, _mm256_setr_epi64x(sh[0], sh[1], sh[2], sh[3]), sc, x[i].qs + 32 * j));
        }
        const float d = h2f(iq1_m_d(sw));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d * 0.125f * x[i].d), acc);
    }
    return hsum_ps(acc);
}

// NVFP4 x Q8_0: a Q8_0 block is two sub-blocks of 16; their nibbles in element order (low nibbles of
// 8 bytes, then their high ones) through the table, the two halves' lanes with their own scales.
float dot_nvfp4(int64_t n, const void* wv, const void* xv) {
    const BlockNVFP4* w = static_cast<const BlockNVFP4*>(wv);
    const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_mxfp4)));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_NVFP4; ++i) {
        for (int h = 0; h < 2; ++h) {
            const BlockQ8_0& xb = x[2 * i + h];
            const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].qs + 16 * h));
            const __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
            const __m256i codes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi64(lo, hi)),
                                                          _mm_unpackhi_epi64(lo, hi), 1);
            const __m256i p = pair_sums(_mm256_shuffle_epi8(table, codes), xb.qs);
            const float dy = h2f(xb.d), d0 = ue4m3_half(w[i].d[2 * h]) * dy, d1 = ue4m3_half(w[i].d[2 * h + 1]) * dy;
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_setr_ps(d0, d0, d0, d0, d1, d1, d1, d1), acc);
        }
    }
    return hsum_ps(acc);
}

}  // namespace

VecDotFn vec_dot_low_bit_avx2(GGMLType type) {
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
