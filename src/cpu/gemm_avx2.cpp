// AVX2 tiles of 1 weight row x 4 tokens for the legacy 32-element types (Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, IQ4_NL) and the super-block types (Q4_K, Q5_K, Q6_K, IQ4_XS): each weight block is turned
// into bytes once for four tokens. Every output keeps vec_dot_avx2.cpp's accumulators (legacy: even blocks, odd blocks,
// the min term; K-quants: the scaled sums and the mins) and repeats their float operations in
// their order, so it is bit-identical to it.
#include <immintrin.h>

#include <type_traits>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/isa_kernels.h"
#include "cpu/simd_avx2.h"
#include "quant/decode.h"

namespace ember {
namespace {

using namespace avx2;

constexpr int C = 4; // tokens per tile: 8 accumulators

// The tile's activation scales as floats, block-major: d[i * C + c] and s[i * C + c] (Q8_1) of
// block i of token c, so one 128-bit load serves the four tokens.
template <Legacy K>
void tile_scales(const typename LegacyBlocks<K>::X* const (&x)[C], int64_t nb, float* d, float* s) {
    for (int64_t i = 0; i < nb; ++i)
        for (int c = 0; c < C; ++c) {
            d[i * C + c] = h2f(x[c][i].d);
            if constexpr (kHasMin<K>) s[i * C + c] = h2f(x[c][i].s);
        }
}

// y[c * n_out] for one row w and tokens x[0..C).
template <Legacy K>
void tile(int64_t nb, const typename LegacyBlocks<K>::W* w, const typename LegacyBlocks<K>::X* const (&x)[C],
          const float* xd, const float* xs, float* y, int64_t n_out) {
    __m256 acc[2][C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[0][c] = acc[1][c] = _mm256_setzero_ps();
    __m128 summ = _mm_setzero_ps(); // lane c: vec_dot's summ of token c
    auto one = [&](int64_t i, int a) __attribute__((always_inline)) {
        const __m256i wb = weight_bytes<K>(w[i]);
        // block_dot's operand that does not depend on the token
        const __m256i wu = kSignedWeights<K> ? _mm256_abs_epi8(wb) : wb;
        // vec_dot's d_w * d_x, one rounding each, for the four tokens at once
        const __m256 dd = _mm256_castps128_ps256(_mm_mul_ps(_mm_set1_ps(h2f(w[i].d)), _mm_loadu_ps(xd + i * C)));
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            __m256i xv = load256(x[c][i].qs);
            if constexpr (kSignedWeights<K>) xv = _mm256_sign_epi8(xv, wb);
            const __m256 scale = _mm256_permutevar8x32_ps(dd, _mm256_set1_epi32(c));
            acc[a][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(wu, xv)), scale, acc[a][c]);
        }
        if constexpr (kHasMin<K>) summ = _mm_fmadd_ps(_mm_set1_ps(h2f(w[i].m)), _mm_loadu_ps(xs + i * C), summ);
    };
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        one(i, 0);
        one(i + 1, 1);
    }
    if (i < nb) one(i, 0);
    alignas(16) float m[C];
    _mm_store_ps(m, summ);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) y[c * n_out] = hsum_ps(_mm256_add_ps(acc[0][c], acc[1][c])) + m[c];
}

template <Legacy K>
void gemm(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok, int64_t o_begin,
          int64_t o_end, float* y, int64_t n_out) {
    using W = typename LegacyBlocks<K>::W;
    using X = typename LegacyBlocks<K>::X;
    const int64_t nb = n_in / 32;
    std::vector<float> xd(size_t(nb * C)), xs(kHasMin<K> ? size_t(nb * C) : 0);
    const X* xb[C];
    run_tiles<1, C>(
        n_in, w, w_row, x, x_row, n_tok, o_begin, o_end, y, n_out, vec_dot_avx2(LegacyBlocks<K>::type),
        [&](const uint8_t* const* xt) {
            for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const X*>(xt[c]);
            tile_scales<K>(xb, nb, xd.data(), xs.data());
        },
        [&](const uint8_t* const* wr, const uint8_t* const*, float* yt) {
            tile<K>(nb, reinterpret_cast<const W*>(wr[0]), xb, xd.data(), xs.data(), yt, n_out);
        });
}

// ---- K-quants x Q8_K ------------------------------------------------------------------------

// vec_dot's float step of super-block i for the C tokens: acc[c] += sumi[c] * d_w * d_x. The
// accumulators live in memory (one load and store a super-block): in registers next to the
// integer sums they pushed those out to the stack.
__attribute__((always_inline)) inline void scale_block(float dw, const BlockQ8_K* const (&x)[C], int64_t i,
                                                       const __m256i (&sumi)[C], float (&acc)[C][8]) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
        _mm256_storeu_ps(acc[c], _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[c]), _mm256_set1_ps(dw * x[c][i].d),
                                                 _mm256_loadu_ps(acc[c])));
}

template <bool Q5>
void tile_q45_k(int64_t nb, const std::conditional_t<Q5, BlockQ5_K, BlockQ4_K>* w, const BlockQ8_K* const (&x)[C],
                float* y, int64_t n_out) {
    float acc[C][8] = {};
    for (int64_t i = 0; i < nb; ++i) {
        const KScales sc(w[i].scales);
        __m256i sumi[C];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) sumi[c] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            const Q45Chunk<Q5> q(w[i], k);
            const __m256i s_lo = _mm256_set1_epi16(sc.sc[2 * k]), s_hi = _mm256_set1_epi16(sc.sc[2 * k + 1]);
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) {
                const int8_t* xq = x[c][i].qs + 64 * k;
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(_mm256_maddubs_epi16(q.lo, load256(xq)), s_lo));
                sumi[c] = _mm256_add_epi32(sumi[c],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(q.hi, load256(xq + 32)), s_hi));
            }
        }
        scale_block(h2f(w[i].d), x, i, sumi, acc);
    }
    // vec_dot's min accumulators: their own chains, so a second pass gives the same floats
    __m256 accm[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) accm[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const __m256i mins = KScales(w[i].scales).mins16();
        const float dmin = h2f(w[i].dmin);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c)
            accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KScales::min_products(mins, x[c][i])),
                                      _mm256_set1_ps(dmin * x[c][i].d), accm[c]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) y[c * n_out] = hsum_ps(_mm256_loadu_ps(acc[c])) - hsum_ps(accm[c]);
}

void tile_q6_k(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* const (&x)[C], float* y, int64_t n_out) {
    float acc[C][8] = {};
    for (int64_t i = 0; i < nb; ++i) {
        __m256i sumi[C];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) sumi[c] = q6_offset_term(w[i], x[c][i]);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            const Q6Half q(w[i], h);
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k) {
                const __m256i v = q.values(k), s = q6_scales(w[i], h, k);
#pragma GCC unroll 4
                for (int c = 0; c < C; ++c) {
                    const __m256i p = _mm256_maddubs_epi16(v, load256(x[c][i].qs + 128 * h + 32 * k));
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, s));
                }
            }
        }
        scale_block(h2f(w[i].d), x, i, sumi, acc);
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) y[c * n_out] = hsum_ps(_mm256_loadu_ps(acc[c]));
}

// IQ4_XS: per sub-block the table values and the scale once for the C tokens, then vec_dot's
// pair sums (|x| against the values carrying x's sign: a Q8_K -128 stays exact) per token.
void tile_iq4_xs(int64_t nb, const BlockIQ4_XS* w, const BlockQ8_K* const (&x)[C], float* y, int64_t n_out) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl)));
    __m256 acc[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        __m256i sumi[C];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) sumi[c] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const __m256i v = _mm256_shuffle_epi8(table, nibbles32(w[i].qs + 16 * j));
            const __m256i sc = _mm256_set1_epi16(int16_t(iq4_xs_scale(w[i], j)));
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) {
                const __m256i xv = load256(x[c][i].qs + 32 * j);
                const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(v, xv));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, sc));
            }
        }
        const float dw = h2f(w[i].d);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c)
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[c]), _mm256_set1_ps(dw * x[c][i].d), acc[c]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) y[c * n_out] = hsum_ps(acc[c]);
}

template <GGMLType T>
void gemm_k(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok,
            int64_t o_begin, int64_t o_end, float* y, int64_t n_out) {
    const int64_t nb = n_in / QK_K;
    const BlockQ8_K* xb[C];
    run_tiles<1, C>(
        n_in, w, w_row, x, x_row, n_tok, o_begin, o_end, y, n_out, vec_dot_avx2(T),
        [&](const uint8_t* const* xt) {
            for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const BlockQ8_K*>(xt[c]);
        },
        [&](const uint8_t* const* wr, const uint8_t* const*, float* yt) {
            if constexpr (T == GGMLType::Q6_K) tile_q6_k(nb, reinterpret_cast<const BlockQ6_K*>(wr[0]), xb, yt, n_out);
            else if constexpr (T == GGMLType::IQ4_XS)
                tile_iq4_xs(nb, reinterpret_cast<const BlockIQ4_XS*>(wr[0]), xb, yt, n_out);
            else if constexpr (T == GGMLType::Q5_K)
                tile_q45_k<true>(nb, reinterpret_cast<const BlockQ5_K*>(wr[0]), xb, yt, n_out);
            else tile_q45_k<false>(nb, reinterpret_cast<const BlockQ4_K*>(wr[0]), xb, yt, n_out);
        });
}

} // namespace

GemmFn gemm_avx2_for(VecDotFn dot) {
    static const GemmEntry kTiles[] = {
        {GGMLType::Q4_0, gemm<Legacy::q4_0>},
        {GGMLType::Q4_1, gemm<Legacy::q4_1>},
        {GGMLType::Q5_0, gemm<Legacy::q5_0>},
        {GGMLType::Q5_1, gemm<Legacy::q5_1>},
        {GGMLType::Q8_0, gemm<Legacy::q8_0>},
        {GGMLType::IQ4_NL, gemm<Legacy::iq4_nl>},
        {GGMLType::Q4_K, gemm_k<GGMLType::Q4_K>},
        {GGMLType::Q5_K, gemm_k<GGMLType::Q5_K>},
        {GGMLType::Q6_K, gemm_k<GGMLType::Q6_K>},
        {GGMLType::IQ4_XS, gemm_k<GGMLType::IQ4_XS>},
        {GGMLType::Q2_K, gemm_q2_q3_avx2(GGMLType::Q2_K)},
        {GGMLType::Q3_K, gemm_q2_q3_avx2(GGMLType::Q3_K)},
    };
    return gemm_lookup(dot, vec_dot_avx2, kTiles);
}

} // namespace ember
