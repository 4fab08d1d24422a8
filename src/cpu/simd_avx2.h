// AVX2 + FMA + F16C building blocks shared by the AVX2 dot products (vec_dot_avx2.cpp) and the
// AVX2 batch tiles (gemm_avx2.cpp), which must compute the same integer lanes and floats. Only
// files built with those ISA flags include it.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "cpu/legacy_blocks.h"
#include "quant/blocks.h"
#include "quant/quant_tables.h"

namespace ember {
namespace avx2 {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

// 16 nibble bytes -> 32 bytes: low nibbles (elements 0..15) then high nibbles (16..31).
inline __m256i nibbles32(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes, 0x10 where bit j of qh is set (bit 4 of the Q5 quants).
inline __m256i q5_high_bits(const uint8_t* qh) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(int(h)), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                                    2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ULL));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// s32 x 8 dot of unsigned w with signed x (no s16 saturation: |w| <= 128, |x| <= 127).
inline __m256i dot_u8s8(__m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}
// signed w: |w| against x carrying w's sign (x from our quantizers is in [-127, 127]).
inline __m256i dot_s8s8(__m256i w, __m256i x) { return dot_u8s8(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)); }

// A block's 32 weights as bytes in element order: q - offset for the *_0 kinds (signed), the
// table values for IQ4_NL (signed), q for the *_1 kinds (unsigned).
template <Legacy K, class WB>
inline __m256i weight_bytes(const WB& w) {
    if constexpr (K == Legacy::q8_0) return load256(w.qs);
    else if constexpr (K == Legacy::iq4_nl)
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl))),
            nibbles32(w.qs));
    else if constexpr (K == Legacy::q4_0) return _mm256_sub_epi8(nibbles32(w.qs), _mm256_set1_epi8(8));
    else if constexpr (K == Legacy::q4_1) return nibbles32(w.qs);
    else {
        const __m256i q = _mm256_or_si256(nibbles32(w.qs), q5_high_bits(w.qh));
        if constexpr (K == Legacy::q5_0) return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        else return q;
    }
}

// The 8 s32 lanes of a block's integer dot (lane j: elements 4j..4j+3) from weight_bytes.
template <Legacy K>
inline __m256i block_dot(__m256i wb, const int8_t* xq) {
    if constexpr (kSignedWeights<K>) return dot_s8s8(wb, load256(xq));
    else return dot_u8s8(wb, load256(xq));
}

// ---- K-quants x Q8_K (integer lanes exact: only their partition must match between files) ----

// A Q4_K/Q5_K super-block's 8 sub-block scales and its min term against one token.
struct KScales {
    uint8_t sc[8];
    uint64_t mn;
    explicit KScales(const uint8_t* packed) {
        uint64_t s;
        unpack_scales_k4(packed, s, mn);
        std::memcpy(sc, &s, 8);
    }
    // the mins as 16 words, each repeated to match the 16 bsums
    __m256i mins16() const {
        const __m128i mn8 = _mm_cvtsi64_si128(int64_t(mn));
        return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
    }
    // sum_j mn_j * (bsum_2j + bsum_2j+1), 8 lanes
    static __m256i min_products(__m256i mins16, const BlockQ8_K& x) {
        return _mm256_madd_epi16(load256(x.bsums), mins16);
    }
};

// Chunk c (64 weights) of a Q4_K/Q5_K super-block as bytes: lo = sub-block 2c, hi = 2c + 1.
template <bool Q5>
struct Q45Chunk {
    __m256i lo, hi;
    template <class WB>
    Q45Chunk(const WB& w, int c) {
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        const __m256i q = load256(w.qs + 32 * c);
        lo = _mm256_and_si256(q, m4);
        hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if constexpr (Q5) {
            const __m256i qh = load256(w.qh);
            const __m256i b0 = _mm256_set1_epi8(char(1 << (2 * c))), b1 = _mm256_set1_epi8(char(2 << (2 * c)));
            const __m256i sixteen = _mm256_set1_epi8(16);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
        }
    }
};

// Q6_K: the q - 32 offset as the starting sum, -32 * sum_g sc_g * bsum_g.
inline __m256i q6_offset_term(const BlockQ6_K& w, const BlockQ8_K& x) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales)));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(x.bsums)), 5));
}

// Half h (128 weights) of a Q6_K super-block; values(k): weights 128h + 32k .. + 31 as bytes.
struct Q6Half {
    __m256i ql0, ql1, qh;
    Q6Half(const BlockQ6_K& w, int h)
        : ql0(load256(w.ql + 64 * h)), ql1(load256(w.ql + 64 * h + 32)), qh(load256(w.qh + 32 * h)) {}
    __m256i values(int k) const {
        const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
        const __m256i l = k & 1 ? ql1 : ql0;
        const __m256i low = k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
        const __m256i high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), m2);
        return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    }
};

// The scales of the two 16-weight groups of Q6Half(h).values(k), one per 128-bit half.
inline __m256i q6_scales(const BlockQ6_K& w, int h, int k) {
    const int g = 8 * h + 2 * k;
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(short(w.scales[g]))),
                                   _mm_set1_epi16(short(w.scales[g + 1])), 1);
}

}  // namespace avx2
}  // namespace ember
