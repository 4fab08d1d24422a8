// AVX-512 VNNI tiles of 2 weight rows x 4 tokens for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K
// and Q6_K weights. Each output keeps its own accumulators and repeats vec_dot_avx512.cpp's float
// operations lane for lane (same products, FMAs, adds and reductions), so it is bit-identical
// to it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/isa_kernels.h"
#include "cpu/legacy_blocks.h"
#include "quant/blocks.h"
#include "quant/quant_tables.h"

namespace ember {
namespace {

constexpr int R = 2, C = 4;   // weight rows x tokens per tile: 16 zmm accumulators

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// Integer lane sums need only be exact, not computed as vec_dot does: every operand here is
// made unsigned (Q4 nibbles as they are, Q8_0 bytes and IQ4_NL table values + 128) and the
// offset comes back through a per-token correction sum(off * x) that is shared by all rows of
// the tile.
template <Legacy K>
constexpr int offset() {
    return K == Legacy::q4_0 ? 8 : K == Legacy::q5_0 ? 16 : K == Legacy::q8_0 || K == Legacy::iq4_nl ? 128 : 0;
}

// kvalues_iq4nl + 128 as unsigned bytes, in every 128-bit lane (vpshufb looks up within a lane).
inline __m512i iq4nl_table_u8() {
    return _mm512_xor_si512(_mm512_broadcast_i32x4(load128(kvalues_iq4nl)), _mm512_set1_epi8(char(0x80)));
}

// Q5: bit 4 of element j comes from bit j of qh (a pair: bits 32..63 for the second block).
template <class W>
inline uint32_t qh_bits(const W& b) {
    uint32_t h;
    std::memcpy(&h, b.qh, 4);
    return h;
}

// Weight bytes of blocks b and b + 1 in the activation pair layout (32 bytes per block).
template <Legacy K, class W>
inline __m512i weight_pair(const W* b) {
    if constexpr (K == Legacy::q8_0) {
        return _mm512_xor_si512(join(load256(b[0].qs), load256(b[1].qs)), _mm512_set1_epi8(char(0x80)));
    } else {
        // 128-bit lanes: qs0, qs0 >> 4, qs1, qs1 >> 4, each masked to nibbles
        const __m512i q = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(load128(b[0].qs)), 0xFF00,
                                                      load128(b[1].qs));
        const __m512i nib = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFF00FF00u, q, 4), _mm512_set1_epi8(0x0F));
        if constexpr (kQ5<K>) {
            const __mmask64 high = __mmask64(qh_bits(b[0])) | (__mmask64(qh_bits(b[1])) << 32);
            return _mm512_mask_mov_epi8(nib, high, _mm512_or_si512(nib, _mm512_set1_epi8(0x10)));
        } else if constexpr (K == Legacy::iq4_nl) {
            return _mm512_shuffle_epi8(iq4nl_table_u8(), nib);
        } else {
            return nib;
        }
    }
}

template <Legacy K, class W>
inline __m256i weight_one(const W& b) {
    if constexpr (K == Legacy::q8_0) return _mm256_xor_si256(load256(b.qs), _mm256_set1_epi8(char(0x80)));
    const __m128i q = load128(b.qs);
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    const __m256i nib = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    if constexpr (kQ5<K>) return _mm256_mask_mov_epi8(nib, qh_bits(b), _mm256_or_si256(nib, _mm256_set1_epi8(0x10)));
    else if constexpr (K == Legacy::iq4_nl) return _mm256_shuffle_epi8(_mm512_castsi512_si256(iq4nl_table_u8()), nib);
    else return nib;
}

// The fp16 words of up to 4 consecutive block heads (bytes past n_blk blocks read as 0; the
// masked loads never touch them, so the last row of a mapping is safe).
template <class W>
inline __m512i head_words(const W* w, int n_blk, __m512i idx) {
    constexpr int bs = sizeof(W);
    const int bytes = n_blk * bs;
    const __mmask64 m0 = bytes >= 64 ? ~__mmask64(0) : (__mmask64(1) << bytes) - 1;
    const __m512i lo = _mm512_maskz_loadu_epi8(m0, w);
    if constexpr (3 * bs + 4 <= 64) {
        return _mm512_permutexvar_epi16(idx, lo);
    } else {
        const int rest = std::max(0, bytes - 64);
        const __mmask64 m1 = rest >= 64 ? ~__mmask64(0) : (__mmask64(1) << rest) - 1;
        const __m512i hi = _mm512_maskz_loadu_epi8(m1, reinterpret_cast<const uint8_t*>(w) + 64);
        return _mm512_permutex2var_epi16(lo, idx, hi);
    }
}

// Word indices: d of block l / 8 in word l (two pairs of 16 lanes), and m of block l % 4.
template <class W>
inline __m512i d_index() {
    alignas(64) int16_t idx[32];
    for (int l = 0; l < 32; ++l) idx[l] = int16_t((l / 8) * int(sizeof(W)) / 2);
    return _mm512_load_si512(idx);
}
template <class W>
inline __m512i m_index() {
    alignas(64) int16_t idx[32];
    for (int l = 0; l < 32; ++l) idx[l] = int16_t((l % 4) * int(sizeof(W)) / 2 + 1);
    return _mm512_load_si512(idx);
}

// Per 4-token tile, the activation scales laid out for the inner loop: xe[c][pair][16] holds
// d of the pair's first block in lanes 0-7 and of its second in lanes 8-15 (as vec_dot's
// permuted products have them); xs[group][c][4] holds s of blocks 4g..4g+3 (Q8_1).
template <Legacy K>
void tile_scales(const uint8_t* const* x, int64_t nb, float* xe, float* xs) {
    using X = typename LegacyBlocks<K>::X;
    const int64_t np = nb / 2, ng = (nb + 3) / 4;
    for (int c = 0; c < C; ++c) {
        const X* xb = reinterpret_cast<const X*>(x[c]);
        for (int64_t p = 0; p < np; ++p) {
            float* e = xe + (c * np + p) * 16;
            std::fill(e, e + 8, h2f(xb[2 * p].d));
            std::fill(e + 8, e + 16, h2f(xb[2 * p + 1].d));
        }
        if constexpr (kHasMin<K>) {
            for (int64_t g = 0; g < ng; ++g)
                for (int j = 0; j < 4; ++j) xs[(g * C + c) * 4 + j] = 4 * g + j < nb ? h2f(xb[4 * g + j].s) : 0.0f;
        }
    }
}

// Blocks i .. i + 2 * n_pair - 1 of the tile (n_pair 2: a group of 4, 1: a leftover pair).
// Pair h outermost, so only that pair's row data is live next to the 16 accumulators; forced
// inline with constant loops so the accumulators stay in registers.
template <Legacy K, int n_pair, class W, class X>
__attribute__((always_inline)) inline void group(const W* const* w, const X* const* xb, const float* xe, int64_t np,
                                                 int64_t i, __m512 (&acc)[R][C][2]) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i words[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) words[r] = head_words(w[r] + i, 2 * n_pair, d_index<W>());
#pragma GCC unroll 2
    for (int h = 0; h < n_pair; ++h) {
        __m512i wv[R];
        __m512 wd[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            wv[r] = weight_pair<K>(w[r] + i + 2 * h);
            wd[r] = _mm512_cvtph_ps(h == 0 ? _mm512_castsi512_si256(words[r]) : _mm512_extracti64x4_epi64(words[r], 1));
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const __m512i xv = join(load256(xb[c][i + 2 * h].qs), load256(xb[c][i + 2 * h + 1].qs));
            const __m512 xd = _mm512_loadu_ps(xe + (c * np + h) * 16);
            __m512i base = zero;
            if constexpr (offset<K>() != 0)
                base = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(char(offset<K>())), xv));
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                const __m512i q = _mm512_dpbusd_epi32(base, wv[r], xv);
                // vec_dot: fma(cvt(q), permuted d_w * d_x, acc); the product is rounded the
                // same whether formed before or after the permute
                acc[r][c][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_mul_ps(wd[r], xd), acc[r][c][h]);
            }
        }
    }
}

// y[c * n_out + r] for the tile's R rows and C tokens.
template <Legacy K>
void tile(int64_t nb, const uint8_t* const* wrow, const uint8_t* const* x, const float* xe, const float* xs, float* y,
          int64_t n_out) {
    using W = typename LegacyBlocks<K>::W;
    using X = typename LegacyBlocks<K>::X;
    constexpr bool has_min = kHasMin<K>;
    const W* w[R];
    const X* xb[C];
    for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const W*>(wrow[r]);
    for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const X*>(x[c]);
    const int64_t np = nb / 2;

    // Every loop over acc is unrolled: an indexed access anywhere would keep the whole array
    // in memory, with 16 stores per step.
    __m512 acc[R][C][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) acc[r][c][0] = acc[r][c][1] = _mm512_setzero_ps();

    int64_t i = 0;
    for (; i + 3 < nb; i += 4) group<K, 2>(w, xb, xe + i * 8, np, i, acc);
    if (i + 1 < nb) {
        group<K, 1>(w, xb, xe + i * 8, np, i, acc);
        i += 2;
    }

    // vec_dot's accm: lane 4j+1 sums m_w * s_x of blocks j mod 4, one add per group of 4.
    // Here lanes 4c+j of one register per row hold it for the C tokens. The product must stay
    // a separate rounding (mul_round is a builtin GCC does not fuse into an FMA).
    alignas(64) float msum[R][16];
    if constexpr (has_min) {
        const __m512i midx = m_index<W>();
        for (int r = 0; r < R; ++r) {
            __m512 accm = _mm512_setzero_ps();
            for (int64_t g = 0; 4 * g < i; ++g) {
                const int n_blk = int(std::min<int64_t>(4, i - 4 * g));
                const __m512 mw = _mm512_cvtph_ps(_mm512_castsi512_si256(head_words(w[r] + 4 * g, n_blk, midx)));
                const __m512 p = _mm512_mul_round_ps(mw, _mm512_loadu_ps(xs + g * C * 4), _MM_FROUND_CUR_DIRECTION);
                accm = _mm512_add_ps(accm, p);
            }
            _mm512_store_ps(msum[r], accm);
        }
    }

#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            float s = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][c][0], acc[r][c][1]));
            if constexpr (has_min) {
                const float* m = msum[r] + 4 * c;
                s += (m[0] + m[1]) + (m[2] + m[3]);
            }
            if (i < nb) {   // a last odd block, as vec_dot's scalar tail
                const __m256i xv = load256(xb[c][i].qs);
                __m256i base = _mm256_setzero_si256();
                if constexpr (offset<K>() != 0)
                    base = _mm256_sub_epi32(base, _mm256_dpbusd_epi32(base, _mm256_set1_epi8(char(offset<K>())), xv));
                const __m256i p = _mm256_dpbusd_epi32(base, weight_one<K>(w[r][i]), xv);
                s += h2f(w[r][i].d) * h2f(xb[c][i].d) * float(_mm512_reduce_add_epi32(_mm512_zextsi256_si512(p)));
                if constexpr (has_min) s += h2f(w[r][i].m) * h2f(xb[c][i].s);
            }
            y[c * n_out + r] = s;
        }
    }
}

template <Legacy K>
void gemm(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok, int64_t o_begin,
          int64_t o_end, float* y, int64_t n_out) {
    const int64_t nb = n_in / 32;
    std::vector<float> xe(size_t(C * (nb / 2) * 16)), xs(size_t((nb + 3) / 4 * C * 4));
    run_tiles<R, C>(
        n_in, w, w_row, x, x_row, n_tok, o_begin, o_end, y, n_out, vec_dot_avx512(LegacyBlocks<K>::type),
        [&](const uint8_t* const* xt) { tile_scales<K>(xt, nb, xe.data(), xs.data()); },
        [&](const uint8_t* const* wr, const uint8_t* const* xt, float* yt) {
            tile<K>(nb, wr, xt, xe.data(), xs.data(), yt, n_out);
        });
}

// ---- K-quants x Q8_K ------------------------------------------------------------------------
// Per super-block the tile decodes each row's weights and scale vectors once and runs the
// vec_dot integer ops (maddubs, dpwssd: exact, no saturation) per token, so each token's
// sumi lanes equal vec_dot's; the float steps per block and the reductions are vec_dot's.
enum class KKind { q4_k, q5_k, q6_k };

inline __m512i run_index(int first, int run) {
    alignas(64) int16_t idx[32];
    for (int l = 0; l < 32; ++l) idx[l] = int16_t(first + l / run);
    return _mm512_load_si512(idx);
}

// sumi[r][c] += maddubs(wq[r], token c's 64 int8 at byte `off` of block i), pairs weighted by
// sp[r] (vec_dot's integer step, one 64-value slice).
__attribute__((always_inline)) inline void madd_slice(const __m512i (&wq)[R], const __m512i (&sp)[R],
                                                      const BlockQ8_K* const* xb, int64_t i, int off,
                                                      __m512i (&sumi)[R][C]) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
        const __m512i xv = _mm512_loadu_si512(xb[c][i].qs + off);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r)
            sumi[r][c] = _mm512_dpwssd_epi32(sumi[r][c], _mm512_maddubs_epi16(wq[r], xv), sp[r]);
    }
}

// acc[r][c] += sumi[r][c] * d_w * d_x of block i (vec_dot's float step).
template <class W>
__attribute__((always_inline)) inline void scale_block(const W* const* w, const BlockQ8_K* const* xb, int64_t i,
                                                       const __m512i (&sumi)[R][C], __m512 (&acc)[R][C]) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        const float dw = h2f(w[r][i].d);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c)
            acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[r][c]), _mm512_set1_ps(dw * xb[c][i].d), acc[r][c]);
    }
}

// Q4_K/Q5_K: sumi of block i for the tile; the mins term goes separately (min_terms).
template <bool Q5>
__attribute__((always_inline)) inline void block_q45_k(const std::conditional_t<Q5, BlockQ5_K, BlockQ4_K>* const* w,
                                                       const BlockQ8_K* const* xb, int64_t i, const __m512i (&idx)[4],
                                                       __m512 (&acc)[R][C]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i scales[R], qh2[R], sumi[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        uint64_t sc, mn;
        unpack_scales_k4(w[r][i].scales, sc, mn);
        scales[r] = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc))));
        if constexpr (Q5) {
            const __m256i qh = load256(w[r][i].qh);
            qh2[r] = join(qh, qh);
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) sumi[r][c] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        __m512i wq[R], sp[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m256i q = load256(w[r][i].qs + 32 * k);
            wq[r] = _mm512_and_si512(join(q, _mm256_srli_epi16(q, 4)), m4);
            if constexpr (Q5) {
                const __m512i bits = join(_mm256_set1_epi8(char(1 << (2 * k))), _mm256_set1_epi8(char(2 << (2 * k))));
                wq[r] = _mm512_mask_add_epi8(wq[r], _mm512_test_epi8_mask(qh2[r], bits), wq[r], _mm512_set1_epi8(16));
            }
            sp[r] = _mm512_permutexvar_epi16(idx[k], scales[r]);
        }
        madd_slice(wq, sp, xb, i, 64 * k, sumi);
    }
    scale_block(w, xb, i, sumi, acc);
}

// vec_dot's accm of one row for the C tokens (each its own FMA chain), then their horizontal
// sums: out[c]. The row's scales are unpacked once for all tokens.
template <class W>
void min_terms(int64_t nb, const W* w, const BlockQ8_K* const* xb, float (&out)[C]) {
    __m256 accm[C];
    for (int c = 0; c < C; ++c) accm[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        uint64_t sc, mn;
        unpack_scales_k4(w[i].scales, sc, mn);
        const __m128i mn8 = _mm_cvtsi64_si128(int64_t(mn));
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
        const float dmin = h2f(w[i].dmin);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const __m256i prod_m = _mm256_madd_epi16(load256(xb[c][i].bsums), mn16);
            accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod_m), _mm256_set1_ps(dmin * xb[c][i].d), accm[c]);
        }
    }
    for (int c = 0; c < C; ++c) {
        const __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm[c]), _mm256_extractf128_ps(accm[c], 1));
        const __m128 m2 = _mm_add_ps(m, _mm_movehl_ps(m, m));
        out[c] = _mm_cvtss_f32(_mm_add_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
    }
}

__attribute__((always_inline)) inline void block_q6_k(const BlockQ6_K* const* w, const BlockQ8_K* const* xb, int64_t i,
                                                      const __m512i (&idx)[4], __m512 (&acc)[R][C]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x03);
    __m512i scales[R], sumi[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(load128(w[r][i].scales));
        scales[r] = _mm512_castsi256_si512(sc16);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const __m256i bias = _mm256_madd_epi16(sc16, load256(xb[c][i].bsums));
            sumi[r][c] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(_mm512_zextsi256_si512(bias), 5));
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        __m512i w01[R], w23[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m512i ql = _mm512_loadu_si512(w[r][i].ql + 64 * h);
            const __m256i qh = load256(w[r][i].qh + 32 * h);
            const __m512i qh01 = _mm512_and_si512(join(qh, _mm256_srli_epi16(qh, 2)), m2);
            const __m512i qh23 = _mm512_and_si512(join(_mm256_srli_epi16(qh, 4), _mm256_srli_epi16(qh, 6)), m2);
            w01[r] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(qh01, 4));
            w23[r] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_slli_epi16(qh23, 4));
        }
#pragma GCC unroll 2
        for (int j = 0; j < 2; ++j) {
            __m512i sp[R];
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) sp[r] = _mm512_permutexvar_epi16(idx[2 * h + j], scales[r]);
            madd_slice(j ? w23 : w01, sp, xb, i, 128 * h + 64 * j, sumi);
        }
    }
    scale_block(w, xb, i, sumi, acc);
}

template <KKind K>
struct KBlock;
template <>
struct KBlock<KKind::q4_k> {
    using W = BlockQ4_K;
    static constexpr GGMLType type = GGMLType::Q4_K;
};
template <>
struct KBlock<KKind::q5_k> {
    using W = BlockQ5_K;
    static constexpr GGMLType type = GGMLType::Q5_K;
};
template <>
struct KBlock<KKind::q6_k> {
    using W = BlockQ6_K;
    static constexpr GGMLType type = GGMLType::Q6_K;
};

// y[c * n_out + r] for the tile's R rows and C tokens.
template <KKind K>
void tile_k(int64_t nb, const uint8_t* const* wrow, const uint8_t* const* x, float* y, int64_t n_out) {
    using W = typename KBlock<K>::W;
    const W* w[R];
    const BlockQ8_K* xb[C];
    for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const W*>(wrow[r]);
    for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const BlockQ8_K*>(x[c]);
    __m512i idx[4];
    for (int k = 0; k < 4; ++k) idx[k] = K == KKind::q6_k ? run_index(4 * k, 8) : run_index(2 * k, 16);
    __m512 acc[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        if constexpr (K == KKind::q6_k) block_q6_k(w, xb, i, idx, acc);
        else block_q45_k<K == KKind::q5_k>(w, xb, i, idx, acc);
    }
    for (int r = 0; r < R; ++r) {
        float mins[C] = {};
        if constexpr (K != KKind::q6_k) min_terms(nb, w[r], xb, mins);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) y[c * n_out + r] = _mm512_reduce_add_ps(acc[r][c]) - mins[c];
    }
}

template <KKind K>
void gemm_k(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok,
            int64_t o_begin, int64_t o_end, float* y, int64_t n_out) {
    const int64_t nb = n_in / QK_K;
    run_tiles<R, C>(
        n_in, w, w_row, x, x_row, n_tok, o_begin, o_end, y, n_out, vec_dot_avx512(KBlock<K>::type),
        [](const uint8_t* const*) {},
        [&](const uint8_t* const* wr, const uint8_t* const* xt, float* yt) { tile_k<K>(nb, wr, xt, yt, n_out); });
}

}  // namespace

GemmFn gemm_avx512_for(VecDotFn dot) {
    static const GemmEntry kTiles[] = {
        {GGMLType::Q4_0, gemm<Legacy::q4_0>},
        {GGMLType::Q4_1, gemm<Legacy::q4_1>},
        {GGMLType::Q5_0, gemm<Legacy::q5_0>},
        {GGMLType::Q5_1, gemm<Legacy::q5_1>},
        {GGMLType::Q8_0, gemm<Legacy::q8_0>},
        {GGMLType::IQ4_NL, gemm<Legacy::iq4_nl>},
        {GGMLType::Q4_K, gemm_k<KKind::q4_k>},
        {GGMLType::Q5_K, gemm_k<KKind::q5_k>},
        {GGMLType::Q6_K, gemm_k<KKind::q6_k>},
        {GGMLType::Q2_K, gemm_q2_q3_avx512(GGMLType::Q2_K)},
        {GGMLType::Q3_K, gemm_q2_q3_avx512(GGMLType::Q3_K)},
    };
    return gemm_lookup(dot, vec_dot_avx512, kTiles);
}

}  // namespace ember
