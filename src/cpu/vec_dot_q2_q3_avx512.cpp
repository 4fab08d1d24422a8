// AVX-512 VNNI dot products of Q2_K and Q3_K x Q8_K and their prompt tiles (2 weight rows x 4
// tokens): one kernel over R rows and C tokens, the dot being its 1 x 1 form, so each tile output is
// the dot's; and the dot is vec_dot_scalar's bit for bit: exact integer sums (maddubs, then vpdpwssd
// against the scales), then the reference's float step.
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
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// Lane k: the sum of the lanes of h[k] (exact in any order).
inline __m256i reduce8(const __m256i (&h)[8]) {
    const __m256i a01 = _mm256_hadd_epi32(h[0], h[1]), a23 = _mm256_hadd_epi32(h[2], h[3]);
    const __m256i a45 = _mm256_hadd_epi32(h[4], h[5]), a67 = _mm256_hadd_epi32(h[6], h[7]);
    const __m256i b0 = _mm256_hadd_epi32(a01, a23), b4 = _mm256_hadd_epi32(a45, a67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b4, 0x20), _mm256_permute2x128_si256(b0, b4, 0x31));
}

// Lane k: the sum of the lanes of h[k].
inline __m128i reduce4(const __m256i (&h)[4]) {
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(h[0], h[1]), _mm256_hadd_epi32(h[2], h[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

// One super-block's integer sums (lanes still to add) and its scales: the one-token dot takes the
// float terms of four blocks in one vector, then adds them to its sum one by one, in block order.
struct BlockSums {
    __m256i si, sm;
    float xd, d, dmin;
};

inline int32_t hsum(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

// Word l of the scale vector of 64 elements from group g on: scale g + l / 8 (word l weights the
// pair sum of elements 2l, 2l + 1).
inline __m512i slice_index(int g) {
    alignas(64) int16_t idx[32];
    for (int l = 0; l < 32; ++l) idx[l] = int16_t(g + l / 8);
    return _mm512_load_si512(idx);
}

// Super-block i of R weight rows against C tokens: s[r][c] += the reference's term (a 2 x 4 tile: lane
// 4r + c of acc, the same float operations in the same order, a lane each). Element
// 128h + 32k + l is bits 2k, 2k + 1 of qs[32h + l] (Q3_K: minus 4 where bit 4h + k of hmask[l] is
// clear, taken here as q + 4 with the 4 folded back through the bsums); a 64-element slice is
// k = 2t, 2t + 1.
template <bool Q3, int R, int C, class Acc>
__attribute__((always_inline)) inline void block(const KBlock<Q3>* const* w, const BlockQ8_K* const* x, int64_t i,
                                                 const __m512i (&idx)[4], Acc& s) {
    const __m512i m3 = _mm512_set1_epi8(3);
    __m512i sc[R], hm[R], sumi[R][C];
    __m256i mn16[R];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
        const KBlock<Q3>& b = w[r][i];
        if constexpr (Q3) {
            alignas(16) uint8_t biased[16];
            q3_k_biased_scales(b.scales, biased);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(load128(biased), _mm_set1_epi8(32)));
            sc[r] = _mm512_castsi256_si512(sc16);
            const __m256i h = load256(b.hmask);
            hm[r] = join(h, h);
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) {
                const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(x[c][i].bsums)), 2);
                sumi[r][c] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), off));
            }
        } else {
            const __m128i packed = load128(b.scales), m4 = _mm_set1_epi8(0x0F);
            sc[r] = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(packed, m4)));
            mn16[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) sumi[r][c] = _mm512_setzero_si512();
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
        for (int t = 0; t < 2; ++t) {
            __m512i wq[R], sp[R];
#pragma GCC unroll 2
            for (int r = 0; r < R; ++r) {
                const __m256i q = load256(w[r][i].qs + 32 * h);
                wq[r] = _mm512_and_si512(join(_mm256_srli_epi16(q, 4 * t), _mm256_srli_epi16(q, 4 * t + 2)), m3);
                if constexpr (Q3) {
                    const int j = 4 * h + 2 * t;
                    const __m512i bits = join(_mm256_set1_epi8(char(1 << j)), _mm256_set1_epi8(char(2 << j)));
                    wq[r] = _mm512_mask_add_epi8(wq[r], _mm512_test_epi8_mask(hm[r], bits), wq[r], _mm512_set1_epi8(4));
                }
                sp[r] = _mm512_permutexvar_epi16(idx[2 * h + t], sc[r]);
            }
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) {
                const __m512i xv = _mm512_loadu_si512(x[c][i].qs + 128 * h + 64 * t);
#pragma GCC unroll 2
                for (int r = 0; r < R; ++r)
                    sumi[r][c] = _mm512_dpwssd_epi32(sumi[r][c], _mm512_maddubs_epi16(wq[r], xv), sp[r]);
            }
        }
    }
    if constexpr (std::is_same<Acc, BlockSums>::value) {
        s.si = _mm256_add_epi32(_mm512_castsi512_si256(sumi[0][0]), _mm512_extracti64x4_epi64(sumi[0][0], 1));
        s.sm = Q3 ? _mm256_setzero_si256() : _mm256_madd_epi16(mn16[0], load256(x[0][i].bsums));
        s.xd = x[0][i].d;
        s.d = h2f(w[0][i].d);
        s.dmin = h2f(dmin_bits(w[0][i]));
    } else if constexpr (R == 2 && C == 4) {
        __m256i si[8], sm[8];
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) {
                si[4 * r + c] = _mm256_add_epi32(_mm512_castsi512_si256(sumi[r][c]),
                                                 _mm512_extracti64x4_epi64(sumi[r][c], 1));
                sm[4 * r + c] = Q3 ? _mm256_setzero_si256() : _mm256_madd_epi16(mn16[r], load256(x[c][i].bsums));
            }
        const __m128 xd4 = _mm_setr_ps(x[0][i].d, x[1][i].d, x[2][i].d, x[3][i].d);
        const __m256 xd = _mm256_set_m128(xd4, xd4);
        const __m256 d = _mm256_set_m128(_mm_set1_ps(h2f(w[1][i].d)), _mm_set1_ps(h2f(w[0][i].d)));
        const __m256 dmin = _mm256_set_m128(_mm_set1_ps(h2f(dmin_bits(w[1][i]))), _mm_set1_ps(h2f(dmin_bits(w[0][i]))));
        const __m256 terms = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(reduce8(si))),
                                           _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(reduce8(sm))));
        s = _mm256_add_ps(s, _mm256_mul_ps(xd, terms));
    } else {
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) {
            const float d = h2f(w[r][i].d), dmin = h2f(dmin_bits(w[r][i]));
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) {
                int32_t summ = 0;
                if constexpr (!Q3) summ = hsum(_mm256_madd_epi16(mn16[r], load256(x[c][i].bsums)));
                s[r][c] += k_block_term(x[c][i].d, d, dmin, _mm512_reduce_add_epi32(sumi[r][c]), summ);
            }
        }
    }
}

inline void slice_indices(__m512i (&idx)[4]) {
    for (int k = 0; k < 4; ++k) idx[k] = slice_index(4 * k);
}

template <bool Q3>
float dot(int64_t n, const void* wv, const void* xv) {
    const KBlock<Q3>* w[1] = {static_cast<const KBlock<Q3>*>(wv)};
    const BlockQ8_K* x[1] = {static_cast<const BlockQ8_K*>(xv)};
    __m512i idx[4];
    slice_indices(idx);
    const int64_t nb = n / QK_K;
    float s[1][1] = {{0.0f}};
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        BlockSums b[4];
        for (int j = 0; j < 4; ++j) block<Q3, 1, 1>(w, x, i + j, idx, b[j]);
        const __m256i si[4] = {b[0].si, b[1].si, b[2].si, b[3].si}, sm[4] = {b[0].sm, b[1].sm, b[2].sm, b[3].sm};
        const __m128 xd = _mm_setr_ps(b[0].xd, b[1].xd, b[2].xd, b[3].xd);
        const __m128 d = _mm_setr_ps(b[0].d, b[1].d, b[2].d, b[3].d);
        const __m128 dmin = _mm_setr_ps(b[0].dmin, b[1].dmin, b[2].dmin, b[3].dmin);
        const __m128 terms = _mm_mul_ps(xd, _mm_sub_ps(_mm_mul_ps(d, _mm_cvtepi32_ps(reduce4(si))),
                                                       _mm_mul_ps(dmin, _mm_cvtepi32_ps(reduce4(sm)))));
        alignas(16) float t[4];
        _mm_store_ps(t, terms);
        for (int j = 0; j < 4; ++j) s[0][0] += t[j];
    }
    for (; i < nb; ++i) block<Q3, 1, 1>(w, x, i, idx, s);
    return s[0][0];
}

constexpr int R = 2, C = 4;   // weight rows x tokens per tile

template <bool Q3>
void gemm(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok, int64_t o_begin,
          int64_t o_end, float* y, int64_t n_out) {
    const int64_t nb = n_in / QK_K;
    __m512i idx[4];
    slice_indices(idx);
    run_tiles<R, C>(
        n_in, w, w_row, x, x_row, n_tok, o_begin, o_end, y, n_out, dot<Q3>, [](const uint8_t* const*) {},
        [&](const uint8_t* const* wr, const uint8_t* const* xt, float* yt) {
            const KBlock<Q3>* wb[R];
            const BlockQ8_K* xb[C];
            for (int r = 0; r < R; ++r) wb[r] = reinterpret_cast<const KBlock<Q3>*>(wr[r]);
            for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const BlockQ8_K*>(xt[c]);
            __m256 acc = _mm256_setzero_ps();
            for (int64_t i = 0; i < nb; ++i) block<Q3, R, C>(wb, xb, i, idx, acc);
            alignas(32) float s[R * C];
            _mm256_store_ps(s, acc);
            for (int r = 0; r < R; ++r)
                for (int c = 0; c < C; ++c) yt[c * n_out + r] = s[C * r + c];
        });
}

}  // namespace

VecDotFn vec_dot_q2_q3_avx512(GGMLType type) {
    if (type == GGMLType::Q2_K) return dot<false>;
    if (type == GGMLType::Q3_K) return dot<true>;
    return nullptr;
}

GemmFn gemm_q2_q3_avx512(GGMLType type) {
    if (type == GGMLType::Q2_K) return gemm<false>;
    if (type == GGMLType::Q3_K) return gemm<true>;
    return nullptr;
}

}  // namespace ember
