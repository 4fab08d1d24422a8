// AVX2 dot products of Q2_K and Q3_K x Q8_K and their prompt tiles (1 weight row x 4 tokens). Both
// run one kernel over C tokens, the dot being its C = 1 form, so each tile output is the dot's; and
// the dot is vec_dot_scalar's bit for bit: exact integer sums, then the reference's float step.
#include <immintrin.h>

#include <type_traits>

#include "cpu/gemm.h"
#include "cpu/isa_kernels.h"
#include "cpu/q2_q3_k.h"
#include "quant/blocks.h"

namespace ember {
namespace {

template <bool Q3>
using KBlock = std::conditional_t<Q3, BlockQ3_K, BlockQ2_K>;

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

inline int32_t hsum(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

// Lane k: the sum of the lanes of h[k] (exact in any order).
inline __m128i reduce4(const __m256i (&h)[4]) {
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(h[0], h[1]), _mm256_hadd_epi32(h[2], h[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

// The words that weight the 16 pair sums maddubs leaves for 32 elements from group g (even) on:
// scale g in the low 128-bit lane, g + 1 in the high one (sc16: word j is scale j).
inline __m256i pair_scales(__m256i sc16, int g) {
    const __m256i both = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(g / 2));
    return _mm256_shuffle_epi8(both, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3,
                                                      2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
}

// Super-block i of one weight row against C tokens: s[c] += the reference's term of token c (four
// tokens: lane c of acc, the same float operations in the same order, a lane each).
// Element 128h + 32k + l is bits 2k, 2k + 1 of qs[32h + l] (Q3_K: minus 4 where bit 4h + k of
// hmask[l] is clear, taken here as q + 4 with the 4 folded back through the bsums).
template <bool Q3, int C, class Acc>
__attribute__((always_inline)) inline void block(const KBlock<Q3>& w, const BlockQ8_K* const* x, int64_t i, Acc& s) {
    const __m256i m3 = _mm256_set1_epi8(3), zero = _mm256_setzero_si256();
    __m256i sc16, mn16 = zero, hm = zero, sumi[C];
    if constexpr (Q3) {
        alignas(16) uint8_t b[16];
        q3_k_biased_scales(w.scales, b);
        sc16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(load128(b), _mm_set1_epi8(32)));
        hm = load256(w.hmask);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c)
            sumi[c] = _mm256_sub_epi32(zero, _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(x[c][i].bsums)), 2));
    } else {
        const __m128i packed = load128(w.scales), m4 = _mm_set1_epi8(0x0F);
        sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, m4));
        mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) sumi[c] = zero;
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        const __m256i q = load256(w.qs + 32 * h);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
            if constexpr (Q3) {
                const __m256i bit = _mm256_set1_epi8(char(1 << (4 * h + k)));
                const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
                v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(4)));
            }
            const __m256i sc = pair_scales(sc16, 8 * h + 2 * k);
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) {
                const __m256i p = _mm256_maddubs_epi16(v, load256(x[c][i].qs + 128 * h + 32 * k));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, sc));
            }
        }
    }
    const float d = h2f(w.d), dmin = h2f(dmin_bits(w));
    if constexpr (C == 4) {
        __m256i sm[4];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) sm[c] = Q3 ? zero : _mm256_madd_epi16(mn16, load256(x[c][i].bsums));
        const __m128 xd = _mm_setr_ps(x[0][i].d, x[1][i].d, x[2][i].d, x[3][i].d);
        const __m128 terms = _mm_sub_ps(_mm_mul_ps(_mm_set1_ps(d), _mm_cvtepi32_ps(reduce4(sumi))),
                                        _mm_mul_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(reduce4(sm))));
        s = _mm_add_ps(s, _mm_mul_ps(xd, terms));
    } else {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const int32_t summ = Q3 ? 0 : hsum(_mm256_madd_epi16(mn16, load256(x[c][i].bsums)));
            s[c] += k_block_term(x[c][i].d, d, dmin, hsum(sumi[c]), summ);
        }
    }
}

template <bool Q3>
float dot(int64_t n, const void* wv, const void* xv) {
    const KBlock<Q3>* w = static_cast<const KBlock<Q3>*>(wv);
    const BlockQ8_K* x[1] = {static_cast<const BlockQ8_K*>(xv)};
    float s[1] = {0.0f};
    for (int64_t i = 0; i < n / QK_K; ++i) block<Q3, 1>(w[i], x, i, s);
    return s[0];
}

constexpr int C = 4;   // tokens per tile

template <bool Q3>
void gemm(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok, int64_t o_begin,
          int64_t o_end, float* y, int64_t n_out) {
    const int64_t nb = n_in / QK_K;
    const BlockQ8_K* xb[C];
    run_tiles<1, C>(
        n_in, w, w_row, x, x_row, n_tok, o_begin, o_end, y, n_out, dot<Q3>,
        [&](const uint8_t* const* xt) {
            for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const BlockQ8_K*>(xt[c]);
        },
        [&](const uint8_t* const* wr, const uint8_t* const*, float* yt) {
            const KBlock<Q3>* wb = reinterpret_cast<const KBlock<Q3>*>(wr[0]);
            __m128 acc = _mm_setzero_ps();
            for (int64_t i = 0; i < nb; ++i) block<Q3, C>(wb[i], xb, i, acc);
            alignas(16) float s[C];
            _mm_store_ps(s, acc);
            for (int c = 0; c < C; ++c) yt[c * n_out] = s[c];
        });
}

}  // namespace

VecDotFn vec_dot_q2_q3_avx2(GGMLType type) {
    if (type == GGMLType::Q2_K) return dot<false>;
    if (type == GGMLType::Q3_K) return dot<true>;
    return nullptr;
}

GemmFn gemm_q2_q3_avx2(GGMLType type) {
    if (type == GGMLType::Q2_K) return gemm<false>;
    if (type == GGMLType::Q3_K) return gemm<true>;
    return nullptr;
}

}  // namespace ember
