// AVX2 batch tiles, one weight row and 8 tokens at a time (then 4 for the tokens left) for the
// legacy 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and the super-block types (Q4_K,
// Q5_K, Q6_K, IQ4_XS): each weight block is unpacked once for the tile's tokens. Every output
// keeps vec_dot_avx2.cpp's accumulators (legacy: even blocks, odd blocks, the min term;
// super-blocks: the scaled sums and the mins), with the same exact integer lanes, and repeats
// their float operations in their order, so it is bit-identical to it.
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

// ---- legacy 32-element kinds x Q8_0 / Q8_1 ---------------------------------------------------

// The legacy tiles compute vec_dot's integer lanes (exact integers) without its per-token vpsignb.
// The 4- and 5-bit kinds take their quants as they are stored, unsigned, against the activation
// bytes (vpmaddubsw, vpmaddwd by ones), then take off offset * (the lane's sum of x), which the
// token tile holds. IQ4_NL and Q8_0, whose signed values have no such offset that keeps
// vpmaddubsw's int16 sums from saturating, split weights and activations alike into the pairs of
// elements 4j, 4j + 1 (a) and 4j + 2, 4j + 3 (b), widened to int16, so that
// madd(w_a, x_a) + madd(w_b, x_b) is lane j. The activations are prepared once per token tile;
// each weight block once per row.
template <Legacy K>
constexpr bool kUnsignedQuants = K != Legacy::iq4_nl && K != Legacy::q8_0;
template <Legacy K>
constexpr int kOffset = K == Legacy::q4_0   ? 8
                        : K == Legacy::q5_0 ? 16
                                            : 0;

// The stored quants of a 4- or 5-bit block as unsigned bytes in element order (no offset).
template <Legacy K, class WB>
__attribute__((always_inline)) inline __m256i quant_bytes(const WB& w) {
    if constexpr (kQ5<K>) return _mm256_or_si256(nibbles32(w.qs), q5_high_bits(w.qh));
    else return nibbles32(w.qs);
}

struct Split16 {
    __m256i a, b;
};
__attribute__((always_inline)) inline Split16 split16(__m256i bytes) {
    const __m256i pairs = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12,
                                           13, 2, 3, 6, 7, 10, 11, 14, 15);
    // qword order 0, 2 | 1, 3: the a pairs of both 128-bit lanes, then the b pairs
    const __m256i t = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bytes, pairs), 0xD8);
    return {_mm256_cvtepi8_epi16(_mm256_castsi256_si128(t)), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(t, 1))};
}

// A token tile's activations, block-major, block i of token c at i * T + c: the bytes (4- and
// 5-bit kinds) with offset * the sum of each group of 4 (the *_0 kinds), or split16's a then b;
// d and s (Q8_1) its scale and sum as floats.
template <Legacy K, int T>
struct LegacyTokens {
    std::vector<int8_t> q8;
    std::vector<int32_t> off;
    std::vector<int16_t> q;
    std::vector<float> d, s;
    void prepare(const typename LegacyBlocks<K>::X* const (&x)[T], int64_t nb) {
        if constexpr (kUnsignedQuants<K>) q8.resize(size_t(nb * T * 32));
        else q.resize(size_t(nb * T * 32));
        off.resize(kOffset<K> ? size_t(nb * T * 8) : 0);
        d.resize(size_t(nb * T));
        s.resize(kHasMin<K> ? size_t(nb * T) : 0);
        for (int64_t i = 0; i < nb; ++i)
            for (int c = 0; c < T; ++c) {
                const __m256i xv = load256(x[c][i].qs);
                if constexpr (kUnsignedQuants<K>) {
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q8.data() + (i * T + c) * 32), xv);
                    if constexpr (kOffset<K> != 0)
                        _mm256_storeu_si256(reinterpret_cast<__m256i*>(off.data() + (i * T + c) * 8),
                                            dot_u8s8(_mm256_set1_epi8(kOffset<K>), xv));
                } else {
                    const Split16 v = split16(xv);
                    int16_t* o = q.data() + (i * T + c) * 32;
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), v.a);
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), v.b);
                }
                d[i * T + c] = h2f(x[c][i].d);
                if constexpr (kHasMin<K>) s[i * T + c] = h2f(x[c][i].s);
            }
    }
};

// y[c * n_out] for one row w and the T tokens of xt. vec_dot's two accumulators (even and odd
// blocks) are two passes over the row, so that one set of T accumulators stays in registers.
template <Legacy K, int T>
void tile(int64_t nb, const typename LegacyBlocks<K>::W* w, const LegacyTokens<K, T>& xt, float* y, int64_t n_out) {
    alignas(32) float even[T][8];
#pragma GCC unroll 2
    for (int pass = 0; pass < 2; ++pass) {
        __m256 acc[T];
#pragma GCC unroll 8
        for (int c = 0; c < T; ++c) acc[c] = _mm256_setzero_ps();
        for (int64_t i = pass; i < nb; i += 2) {
            // vec_dot's d_w * d_x (one rounding) of the T tokens, each broadcast from memory below
            alignas(32) float scale[8];
            if constexpr (T == 8)
                _mm256_store_ps(scale,
                                _mm256_mul_ps(_mm256_set1_ps(h2f(w[i].d)), _mm256_loadu_ps(xt.d.data() + i * T)));
            else _mm_store_ps(scale, _mm_mul_ps(_mm_set1_ps(h2f(w[i].d)), _mm_loadu_ps(xt.d.data() + i * T)));
            if constexpr (kUnsignedQuants<K>) {
                const __m256i wq = quant_bytes<K>(w[i]);
                const int8_t* xq = xt.q8.data() + i * T * 32;
#pragma GCC unroll 8
                for (int c = 0; c < T; ++c) {
                    __m256i sumi = dot_u8s8(wq, load256(xq + 32 * c));
                    if constexpr (kOffset<K> != 0)
                        sumi = _mm256_sub_epi32(sumi, load256(xt.off.data() + (i * T + c) * 8));
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_broadcast_ss(scale + c), acc[c]);
                }
            } else {
                const Split16 wv = split16(weight_bytes<K>(w[i]));
                const int16_t* xq = xt.q.data() + i * T * 32;
#pragma GCC unroll 8
                for (int c = 0; c < T; ++c) {
                    const __m256i sumi = _mm256_add_epi32(_mm256_madd_epi16(wv.a, load256(xq + 32 * c)),
                                                          _mm256_madd_epi16(wv.b, load256(xq + 32 * c + 16)));
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_broadcast_ss(scale + c), acc[c]);
                }
            }
        }
        if (pass == 0) {
#pragma GCC unroll 8
            for (int c = 0; c < T; ++c) _mm256_store_ps(even[c], acc[c]);
            continue;
        }
        // vec_dot's summ of each token: its own chain of FMAs in block order
        alignas(32) float m[T] = {};
        if constexpr (kHasMin<K> && T == 8) {
            __m256 summ = _mm256_setzero_ps();
            for (int64_t j = 0; j < nb; ++j)
                summ = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[j].m)), _mm256_loadu_ps(xt.s.data() + j * T), summ);
            _mm256_store_ps(m, summ);
        } else if constexpr (kHasMin<K>) {
            static_assert(T == 4, "one vector of mins");
            __m128 summ = _mm_setzero_ps();
            for (int64_t j = 0; j < nb; ++j)
                summ = _mm_fmadd_ps(_mm_set1_ps(h2f(w[j].m)), _mm_loadu_ps(xt.s.data() + j * T), summ);
            _mm_store_ps(m, summ);
        }
#pragma GCC unroll 8
        for (int c = 0; c < T; ++c) y[c * n_out] = hsum_ps(_mm256_add_ps(_mm256_load_ps(even[c]), acc[c])) + m[c];
    }
}

// Tiles of 8 tokens, then of 4 for the tokens left (vec_dot for the last few).
template <Legacy K>
void gemm(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok, int64_t o_begin,
          int64_t o_end, float* y, int64_t n_out) {
    using W = typename LegacyBlocks<K>::W;
    using X = typename LegacyBlocks<K>::X;
    const int64_t nb = n_in / 32;
    const VecDotFn dot = vec_dot_avx2(LegacyBlocks<K>::type);
    auto tiles = [&](auto width, int32_t t0, int32_t n) {
        constexpr int T = decltype(width)::value;
        LegacyTokens<K, T> xt;
        run_tiles<1, T>(
            n_in, w, w_row, x + size_t(t0) * x_row, x_row, n, o_begin, o_end, y + int64_t(t0) * n_out, n_out, dot,
            [&](const uint8_t* const* xs) {
                const X* xb[T];
                for (int c = 0; c < T; ++c) xb[c] = reinterpret_cast<const X*>(xs[c]);
                xt.prepare(xb, nb);
            },
            [&](const uint8_t* const* wr, const uint8_t* const*, float* yt) {
                tile<K, T>(nb, reinterpret_cast<const W*>(wr[0]), xt, yt, n_out);
            });
    };
    const int32_t n8 = n_tok / 8 * 8;
    if (n8) tiles(std::integral_constant<int, 8>(), 0, n8);
    if (n8 < n_tok) tiles(std::integral_constant<int, 4>(), n8, n_tok - n8);
}

// ---- K-quants x Q8_K ------------------------------------------------------------------------

// vec_dot's float step of super-block i for the T tokens: acc[c] += sumi[c] * d_w * d_x. The
// accumulators live in memory (one load and store a super-block): in registers next to the
// integer sums they pushed those out to the stack.
template <int T>
__attribute__((always_inline)) inline void scale_block(float dw, const BlockQ8_K* const (&x)[T], int64_t i,
                                                       const __m256i (&sumi)[T], float (&acc)[T][8]) {
#pragma GCC unroll 8
    for (int c = 0; c < T; ++c)
        _mm256_storeu_ps(acc[c], _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[c]), _mm256_set1_ps(dw * x[c][i].d),
                                                 _mm256_loadu_ps(acc[c])));
}

template <bool Q5, int T>
void tile_q45_k(int64_t nb, const std::conditional_t<Q5, BlockQ5_K, BlockQ4_K>* w, const BlockQ8_K* const (&x)[T],
                float* y, int64_t n_out) {
    float acc[T][8] = {};
    for (int64_t i = 0; i < nb; ++i) {
        const KScales sc(w[i].scales);
        __m256i sumi[T];
#pragma GCC unroll 8
        for (int c = 0; c < T; ++c) sumi[c] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            const Q45Chunk<Q5> q(w[i], k);
            const __m256i s_lo = _mm256_set1_epi16(sc.sc[2 * k]), s_hi = _mm256_set1_epi16(sc.sc[2 * k + 1]);
#pragma GCC unroll 8
            for (int c = 0; c < T; ++c) {
                const int8_t* xq = x[c][i].qs + 64 * k;
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(_mm256_maddubs_epi16(q.lo, load256(xq)), s_lo));
                sumi[c] = _mm256_add_epi32(sumi[c],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(q.hi, load256(xq + 32)), s_hi));
            }
        }
        scale_block(h2f(w[i].d), x, i, sumi, acc);
    }
    // vec_dot's min accumulators: their own chains, so a second pass gives the same floats
    __m256 accm[T];
#pragma GCC unroll 8
    for (int c = 0; c < T; ++c) accm[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const __m256i mins = KScales(w[i].scales).mins16();
        const float dmin = h2f(w[i].dmin);
#pragma GCC unroll 8
        for (int c = 0; c < T; ++c)
            accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KScales::min_products(mins, x[c][i])),
                                      _mm256_set1_ps(dmin * x[c][i].d), accm[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < T; ++c) y[c * n_out] = hsum_ps(_mm256_loadu_ps(acc[c])) - hsum_ps(accm[c]);
}

template <int T>
void tile_q6_k(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* const (&x)[T], float* y, int64_t n_out) {
    float acc[T][8] = {};
    for (int64_t i = 0; i < nb; ++i) {
        __m256i sumi[T];
#pragma GCC unroll 8
        for (int c = 0; c < T; ++c) sumi[c] = q6_offset_term(w[i], x[c][i]);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            const Q6Half q(w[i], h);
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k) {
                const __m256i v = q.values(k), s = q6_scales(w[i], h, k);
#pragma GCC unroll 8
                for (int c = 0; c < T; ++c) {
                    const __m256i p = _mm256_maddubs_epi16(v, load256(x[c][i].qs + 128 * h + 32 * k));
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, s));
                }
            }
        }
        scale_block(h2f(w[i].d), x, i, sumi, acc);
    }
#pragma GCC unroll 8
    for (int c = 0; c < T; ++c) y[c * n_out] = hsum_ps(_mm256_loadu_ps(acc[c]));
}

// IQ4_XS: per sub-block the table values and the scale once for the T tokens, then vec_dot's
// pair sums (|x| against the values carrying x's sign: a Q8_K -128 stays exact) per token.
template <int T>
void tile_iq4_xs(int64_t nb, const BlockIQ4_XS* w, const BlockQ8_K* const (&x)[T], float* y, int64_t n_out) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl)));
    float acc[T][8] = {};
    for (int64_t i = 0; i < nb; ++i) {
        __m256i sumi[T];
#pragma GCC unroll 8
        for (int c = 0; c < T; ++c) sumi[c] = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const __m256i v = _mm256_shuffle_epi8(table, nibbles32(w[i].qs + 16 * j));
            const __m256i sc = _mm256_set1_epi16(int16_t(iq4_xs_scale(w[i], j)));
#pragma GCC unroll 8
            for (int c = 0; c < T; ++c) {
                const __m256i xv = load256(x[c][i].qs + 32 * j);
                const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(v, xv));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, sc));
            }
        }
        scale_block(h2f(w[i].d), x, i, sumi, acc);
    }
#pragma GCC unroll 8
    for (int c = 0; c < T; ++c) y[c * n_out] = hsum_ps(_mm256_loadu_ps(acc[c]));
}

// Tiles of 8 tokens, then of 4 for the tokens left (vec_dot for the last few).
template <GGMLType Type>
void gemm_k(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok,
            int64_t o_begin, int64_t o_end, float* y, int64_t n_out) {
    const int64_t nb = n_in / QK_K;
    const VecDotFn dot = vec_dot_avx2(Type);
    auto tiles = [&](auto width, int32_t t0, int32_t n) {
        constexpr int T = decltype(width)::value;
        const BlockQ8_K* xb[T];
        run_tiles<1, T>(
            n_in, w, w_row, x + size_t(t0) * x_row, x_row, n, o_begin, o_end, y + int64_t(t0) * n_out, n_out, dot,
            [&](const uint8_t* const* xs) {
                for (int c = 0; c < T; ++c) xb[c] = reinterpret_cast<const BlockQ8_K*>(xs[c]);
            },
            [&](const uint8_t* const* wr, const uint8_t* const*, float* yt) {
                if constexpr (Type == GGMLType::Q6_K)
                    tile_q6_k<T>(nb, reinterpret_cast<const BlockQ6_K*>(wr[0]), xb, yt, n_out);
                else if constexpr (Type == GGMLType::IQ4_XS)
                    tile_iq4_xs<T>(nb, reinterpret_cast<const BlockIQ4_XS*>(wr[0]), xb, yt, n_out);
                else if constexpr (Type == GGMLType::Q5_K)
                    tile_q45_k<true, T>(nb, reinterpret_cast<const BlockQ5_K*>(wr[0]), xb, yt, n_out);
                else tile_q45_k<false, T>(nb, reinterpret_cast<const BlockQ4_K*>(wr[0]), xb, yt, n_out);
            });
    };
    const int32_t n8 = n_tok / 8 * 8;
    if (n8) tiles(std::integral_constant<int, 8>(), 0, n8);
    if (n8 < n_tok) tiles(std::integral_constant<int, 4>(), n8, n_tok - n8);
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
