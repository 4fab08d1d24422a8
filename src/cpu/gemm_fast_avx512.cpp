// AVX-512 VNNI kernels of the fast batched matmul (gemm_fast.h) for Q4_0, Q4_1, Q8_0, Q4_K, Q5_K
// and Q6_K weights.
//
// Lane layout: a zmm of 16 int32 lanes holds 16 weight rows of one token. Each vpdpbusd takes 4
// consecutive weight bytes of every one of the 16 rows (the unsigned operand: Q4 nibbles as they
// are, Q8_0 bytes + 128) and the token's 4 activation bytes of those elements broadcast (the
// signed operand), so all 64 of its products are useful and nothing is reduced across lanes: the
// block's scales are one vector multiply and FMA over the 16 rows (d_w per lane times the
// token's d_x), and the lanes are the 16 outputs, stored as they are.
//
// Rows lie one after the other in the mapping, so each block of 16 rows is transposed into those
// vectors in registers (16 loads of 16 bytes, a 4x4 dword transpose per 128-bit lane), once per
// token tile of up to kFastTok tokens: at 8 tokens that costs about a third of the products.
// Activations come in blocks of 32 (FastActBlock; for the K-quants Q8_K's values in 32s, each with
// the super-block's d), so a K-quant sub-block of 32 is one of them with its own row scale d * sc
// and min dmin * m (Q6_K: two scales, one per 16). Offsets (Q4_0 8, Q8_0 as unsigned 128, Q6_K 32)
// start the integer sums at -offset * sum(q_x); mins add m_w * s_x per block.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/gemm_fast.h"
#include "cpu/gemm_fast_rows.h"
#include "cpu/legacy_blocks.h"
#include "cpu/transpose16_avx512.h"
#include "quant/blocks.h"

namespace ember {
namespace {

constexpr int kRows = 16;   // weight rows per zmm (one per int32 lane)

inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// out[j] lane r = dword j of the 16 bytes at row0 + r * stride. Register g takes rows g, 4 + g,
// 8 + g, 12 + g in its 128-bit lanes; a 4x4 dword transpose within the lanes then puts row 4k + g
// in dword 4k + g, which is lane r = row r.
__attribute__((always_inline)) inline void transpose_16x4(const uint8_t* row0, size_t stride, __m512i (&out)[4]) {
    const uint8_t* b[4] = {row0, row0 + 4 * stride, row0 + 8 * stride, row0 + 12 * stride};
    __m512i z[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
        z[g] = _mm512_castsi128_si512(load128(b[0] + g * stride));
        z[g] = _mm512_inserti32x4(z[g], load128(b[1] + g * stride), 1);
        z[g] = _mm512_inserti32x4(z[g], load128(b[2] + g * stride), 2);
        z[g] = _mm512_inserti32x4(z[g], load128(b[3] + g * stride), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm512_unpacklo_epi64(t0, t2);
    out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3);
    out[3] = _mm512_unpackhi_epi64(t1, t3);
}

inline int32_t load_i32(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// ai[t] += the 16 rows' weight bytes w (dword j of an activation block) times token t's.
template <int T>
__attribute__((always_inline)) inline void dot4(__m512i (&ai)[T], __m512i w, const FastActBlock& x, int j) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) ai[t] = _mm512_dpbusd_epi32(ai[t], w, _mm512_set1_epi32(load_i32(x.q[t] + 4 * j)));
}

// acc[t] += ai[t] * scale (the rows' weight scales) * d_x of token t.
template <int T>
__attribute__((always_inline)) inline void scale_add(__m512 (&acc)[T], const __m512i (&ai)[T], __m512 scale,
                                                     const FastActBlock& x) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ai[t]), scale), _mm512_set1_ps(x.d[t]), acc[t]);
}

// acc[t] += m (the rows' block mins) * s_x of token t.
template <int T>
__attribute__((always_inline)) inline void min_add(__m512 (&acc)[T], __m512 m, const FastActBlock& x) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.s[t]), acc[t]);
}

// fp16 words of int32 lanes (low or high half) as floats.
inline __m512 half_lo(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
inline __m512 half_hi(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))); }

// ---- Q4_0, Q4_1, Q8_0: one activation block per weight block -----------------------------------
template <Legacy K>
struct LegacyKernel {
    using W = typename LegacyBlocks<K>::W;
    static constexpr size_t kBytes = sizeof(W);   // per weight block
    static constexpr int kActBlocks = 1;          // activation blocks per weight block

    // The weight block at wb (row 0; row r at wb + r * stride) against activation block x.
    template <int T>
    static __attribute__((always_inline)) void block(const uint8_t* wb, size_t stride, __m512i row_off,
                                                     const FastActBlock* x, __m512 (&acc)[T]) {
        constexpr size_t qs = offsetof(W, qs);
        const __m512i head = _mm512_i32gather_epi32(row_off, wb, 1);   // d (| m << 16) of the 16 rows
        __m512i ai[T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) ai[t] = kHasMin<K> ? _mm512_setzero_si512() : _mm512_set1_epi32(x->n[t]);
        __m512i u[4];
        if constexpr (K == Legacy::q8_0) {
            const __m512i flip = _mm512_set1_epi8(char(0x80));   // int8 -> uint8 (+128)
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                transpose_16x4(wb + qs + 16 * h, stride, u);
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j) dot4(ai, _mm512_xor_si512(u[j], flip), *x, 4 * h + j);
            }
        } else {
            // qs byte i: element i in the low nibble, element i + 16 in the high one
            const __m512i m4 = _mm512_set1_epi8(0x0F);
            transpose_16x4(wb + qs, stride, u);
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                dot4(ai, _mm512_and_si512(u[j], m4), *x, j);
                dot4(ai, _mm512_and_si512(_mm512_srli_epi16(u[j], 4), m4), *x, 4 + j);
            }
        }
        scale_add(acc, ai, half_lo(head), *x);
        if constexpr (kHasMin<K>) min_add(acc, half_hi(head), *x);
    }
};

// ---- Q4_K, Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins ---------------------------------
template <bool Q5>
struct Q45KKernel {
    using W = std::conditional_t<Q5, BlockQ5_K, BlockQ4_K>;
    static constexpr size_t kBytes = sizeof(W);
    static constexpr int kActBlocks = 8;

    template <int T>
    static __attribute__((always_inline)) void block(const uint8_t* wb, size_t stride, __m512i, const FastActBlock* x,
                                                     __m512 (&acc)[T]) {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i m4d = _mm512_set1_epi32(0x0F), m6 = _mm512_set1_epi32(63), m30 = _mm512_set1_epi32(0x30);
        // The head (d, dmin, 12 scale bytes) is 16 bytes: one transpose gives it per lane.
        __m512i hd[4];
        transpose_16x4(wb, stride, hd);
        const __m512 d = half_lo(hd[0]), dmin = half_hi(hd[0]);
        alignas(64) __m512i qh[8];   // Q5_K: dword j lane r = qh[4j..4j+3] of row r
        if constexpr (Q5) {
            __m512i u[4];
            transpose_16x4(wb + offsetof(W, qh), stride, u);
            for (int j = 0; j < 4; ++j) qh[j] = u[j];
            transpose_16x4(wb + offsetof(W, qh) + 16, stride, u);
            for (int j = 0; j < 4; ++j) qh[4 + j] = u[j];
        }
#pragma GCC unroll 1
        for (int c = 0; c < 4; ++c) {   // qs chunk c: sub-blocks 2c (low nibbles), 2c + 1 (high)
            __m512i u[8], v[4];
            transpose_16x4(wb + offsetof(W, qs) + 32 * c, stride, v);
            for (int j = 0; j < 4; ++j) u[j] = v[j];
            transpose_16x4(wb + offsetof(W, qs) + 32 * c + 16, stride, v);
            for (int j = 0; j < 4; ++j) u[4 + j] = v[j];
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                const int sb = 2 * c + h;
                // get_scale_min_k4 of sub-block sb, per lane
                __m512i sc, mn;
                if (sb < 4) {
                    sc = _mm512_and_si512(_mm512_srli_epi32(hd[1], 8 * sb), m6);
                    mn = _mm512_and_si512(_mm512_srli_epi32(hd[2], 8 * sb), m6);
                } else {
                    const int k = 8 * (sb - 4);
                    sc = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(hd[3], k), m4d),
                                         _mm512_and_si512(_mm512_srli_epi32(hd[1], k + 2), m30));
                    mn = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(hd[3], k + 4), m4d),
                                         _mm512_and_si512(_mm512_srli_epi32(hd[2], k + 2), m30));
                }
                const FastActBlock& xb = x[sb];
                __m512i ai[T];
#pragma GCC unroll 8
                for (int t = 0; t < T; ++t) ai[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) {
                    __m512i w = h ? _mm512_and_si512(_mm512_srli_epi16(u[j], 4), m4) : _mm512_and_si512(u[j], m4);
                    if constexpr (Q5) {
                        const __mmask64 hi = _mm512_test_epi8_mask(qh[j], _mm512_set1_epi8(char(1 << sb)));
                        w = _mm512_mask_add_epi8(w, hi, w, _mm512_set1_epi8(16));
                    }
                    dot4(ai, w, xb, j);
                }
                scale_add(acc, ai, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)), xb);
                min_add(acc, _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), dmin), _mm512_cvtepi32_ps(mn)), xb);
            }
        }
    }
};

// ---- Q6_K: 16 sub-blocks of 16 with int8 scales, 6-bit values offset by 32 ---------------------
struct Q6KKernel {
    using W = BlockQ6_K;
    static constexpr size_t kBytes = sizeof(W);
    static constexpr int kActBlocks = 8;

    template <int T>
    static __attribute__((always_inline)) void block(const uint8_t* wb, size_t stride, __m512i row_off,
                                                     const FastActBlock* x, __m512 (&acc)[T]) {
        const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
        // d: the high word of the dword ending the block (scales[14..15], d), in bounds
        const __m512 d = half_hi(_mm512_i32gather_epi32(row_off, wb + offsetof(W, d) - 2, 1));
        __m512i sc4[4];   // dword g lane r: scales[4g..4g+3] of row r
        transpose_16x4(wb + offsetof(W, scales), stride, sc4);
#pragma GCC unroll 1
        for (int half = 0; half < 2; ++half) {   // elements 128 half + 32k + l
            alignas(64) __m512i ql[16], qh[8];   // dword j lane r: ql[64 half + 4j..] / qh[32 half + 4j..]
            for (int q = 0; q < 4; ++q) {
                __m512i v[4];
                transpose_16x4(wb + offsetof(W, ql) + 64 * half + 16 * q, stride, v);
                for (int j = 0; j < 4; ++j) ql[4 * q + j] = v[j];
            }
            for (int q = 0; q < 2; ++q) {
                __m512i v[4];
                transpose_16x4(wb + offsetof(W, qh) + 32 * half + 16 * q, stride, v);
                for (int j = 0; j < 4; ++j) qh[4 * q + j] = v[j];
            }
#pragma GCC unroll 1
            for (int k = 0; k < 4; ++k) {   // value: ql[64 half + 32 (k & 1) + l] nibble k >> 1, qh bits 2k, 2k + 1
                const FastActBlock& xb = x[4 * half + k];
#pragma GCC unroll 2
                for (int g = 0; g < 2; ++g) {   // elements 16g..16g + 15 of the block: scale 8 half + 2k + g
                    __m512i ai[T];
#pragma GCC unroll 8
                    for (int t = 0; t < T; ++t) ai[t] = _mm512_set1_epi32(g ? xb.n[t] - xb.h[t] : xb.h[t]);
#pragma GCC unroll 4
                    for (int j = 4 * g; j < 4 * g + 4; ++j) {
                        __m512i lo = ql[8 * (k & 1) + j];
                        if (k >= 2) lo = _mm512_srli_epi16(lo, 4);
                        __m512i hb = qh[j];
                        hb = 2 * k > 4 ? _mm512_srli_epi16(hb, 2 * k - 4) : _mm512_slli_epi16(hb, 4 - 2 * k);
                        // (lo & 0x0F) | (hb & 0x30)
                        const __m512i w = _mm512_ternarylogic_epi32(_mm512_and_si512(lo, m4), hb, m30, 0xF8);
                        dot4(ai, w, xb, j);
                    }
                    const int s = 8 * half + 2 * k + g;
                    const __m512i sv = _mm512_srai_epi32(_mm512_slli_epi32(sc4[s / 4], 24 - 8 * (s % 4)), 24);
                    scale_add(acc, ai, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sv)), xb);
                }
            }
        }
    }
};

// y[t * n_out + r] for the 16 rows at row0 + r * stride (lanes in `mask` stored) and the T tokens of
// one activation tile; nb weight blocks per row. row_off lane r = r * stride; next: the following
// 16 rows, to prefetch (or null).
template <class Kern, int T>
void rows_tokens(const uint8_t* row0, size_t stride, __m512i row_off, int64_t nb, const FastActBlock* a, float* y,
                 int64_t n_out, __mmask16 mask, const uint8_t* next) {
    __m512 acc[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const size_t o = size_t(b) * Kern::kBytes;
        if (next) {
            const uint8_t* pf = next + o * kRows;
#pragma GCC unroll 64
            for (size_t l = 0; l < (kRows * Kern::kBytes + 63) / 64; ++l)
                _mm_prefetch(reinterpret_cast<const char*>(pf + 64 * l), _MM_HINT_T0);
        }
        Kern::template block<T>(row0 + o, stride, row_off, a + b * Kern::kActBlocks, acc);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * n_out, mask, acc[t]);
}

template <class Kern>
void gemm_fast(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* act, int32_t n_tok, int64_t o_begin,
               int64_t o_end, float* y, int64_t n_out) {
    const int64_t nb = n_in / 32 / Kern::kActBlocks;
    alignas(64) int32_t off[kRows];
    for (int r = 0; r < kRows; ++r) off[r] = int32_t(r * w_row);
    const __m512i row_off = _mm512_load_si512(off);
    fast_gemm_rows<kRows>(
        n_in, w, w_row, act, n_tok, o_begin, o_end, y, n_out,
        [&](auto tc, const uint8_t* row0, int n_rows, const FastActBlock* a, float* yt, const uint8_t* next) {
            const __mmask16 mask = __mmask16((1u << n_rows) - 1);
            rows_tokens<Kern, decltype(tc)::value>(row0, w_row, row_off, nb, a, yt, n_out, mask, next);
        });
}

// ---- one token (FastGemm::gemv) for Q4_0, Q4_1, Q8_0 ------------------------------------------
// gemm's arithmetic, laid out for a weight read once: each row is read as one run of bytes, a
// block pair per vpdpbusd against the token's 64 activation bytes (vec_dot's pattern), and the
// 16 lanes of 4-element sums of 8 pairs are added down to the row's 16 block sums; 16 rows' block
// sums are then transposed into rows in the lanes, where every block takes gemm's float steps in
// gemm's order. Integer sums are exact in any order, so each output is gemm's bit for bit.

// Weight bytes of blocks b and b + 1 as unsigned values in the activation pair layout (Q8_0: + 128,
// which n removes); `two` false: block b alone, the upper half zero (an odd last block).
template <Legacy K>
inline __m512i gemv_weights(const uint8_t* b, bool two) {
    using W = typename LegacyBlocks<K>::W;
    const W* w = reinterpret_cast<const W*>(b);
    if constexpr (K == Legacy::q8_0) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[0].qs));
        const __m256i hi = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[1].qs))
                               : _mm256_set1_epi8(char(0x80));
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(char(0x80)));
    } else {
        // 128-bit lanes: qs0, qs0 >> 4, qs1, qs1 >> 4, each masked to nibbles
        __m512i q = _mm512_broadcast_i32x4(load128(w[0].qs));
        q = two ? _mm512_mask_broadcast_i32x4(q, 0xFF00, load128(w[1].qs)) : _mm512_maskz_mov_epi32(0x00FF, q);
        return _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFF00FF00u, q, 4), _mm512_set1_epi8(0x0F));
    }
}

// The 16 block sums of 8 pair vectors (q[p] lanes 0-7: 4-element sums of block 2p, 8-15: of block
// 2p + 1), in the lanes gemv_lane gives.
inline __m512i block_sums16(const __m512i (&q)[8]) {
    __m512i t[4], u[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)   // per 128-bit lane: q0 d0+d2, q1 d0+d2, q0 d1+d3, q1 d1+d3
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(q[2 * i], q[2 * i + 1]),
                                _mm512_unpackhi_epi32(q[2 * i], q[2 * i + 1]));
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)   // 128-bit lane k: the lane-k sums of q[4i..4i+3]
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]),
                                _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    // block 2p: 128-bit lanes 0 + 1 of its pair, block 2p + 1: lanes 2 + 3
    return _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
}
// Lane of block_sums16's result holding block j of the 16.
constexpr int gemv_lane(int j) { return 4 * (2 * (j / 8) + j % 2) + (j / 2) % 4; }

// The sums of one block pair for 16 rows (q[r]: row r's pair vector): lanes r of even (block 2p)
// and odd (block 2p + 1).
inline void pair_sums16(const __m512i (&q)[16], __m512i& even, __m512i& odd) {
    __m512i t[8], u[4], e[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i)
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(q[2 * i], q[2 * i + 1]),
                                _mm512_unpackhi_epi32(q[2 * i], q[2 * i + 1]));
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)   // 128-bit lane k: lane-k sums of rows 4i .. 4i + 3
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]),
                                _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)   // rows 8i .. 8i + 3 even, odd, rows 8i + 4 .. 8i + 7 even, odd
        e[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2 * i], u[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(u[2 * i], u[2 * i + 1], 0xDD));
    even = _mm512_shuffle_i32x4(e[0], e[1], 0x88);
    odd = _mm512_shuffle_i32x4(e[0], e[1], 0xDD);
}

// Row `row`'s pair vector of blocks b, b + 1 (b + 1 < nb) or of block b alone.
template <Legacy K>
__attribute__((always_inline)) inline __m512i pair_dot(const uint8_t* row, int64_t b, int64_t nb, const int8_t* xq) {
    constexpr size_t bs = sizeof(typename LegacyBlocks<K>::W);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), gemv_weights<K>(row + b * bs, b + 1 < nb),
                               _mm512_loadu_si512(xq + 32 * b));
}

// One row's integer work: its whole chunks of 16 blocks as block_sums16 vectors (sums[16c ..]),
// then the pair vectors of the blocks after them (tail[p * 16 * kRows ..], the row's slot of each).
template <Legacy K>
__attribute__((always_inline)) inline void gemv_row(const uint8_t* row, int64_t nb, const int8_t* xq, int32_t* sums,
                                                    int32_t* tail) {
    const int64_t full = nb / 16 * 16;
    for (int64_t b0 = 0; b0 < full; b0 += 16) {
        __m512i q[8];
#pragma GCC unroll 8
        for (int p = 0; p < 8; ++p) q[p] = pair_dot<K>(row, b0 + 2 * p, nb, xq);
        _mm512_storeu_si512(sums + b0, block_sums16(q));
    }
    for (int64_t b = full; b < nb; b += 2, tail += 16 * kRows) _mm512_storeu_si512(tail, pair_dot<K>(row, b, nb, xq));
}

// acc += block b's float steps (gemm's, in gemm's order) for the 16 rows of row0 (lanes in mask).
template <Legacy K>
__attribute__((always_inline)) inline void gemv_block(__m512& acc, __m512i ai, const uint8_t* row0, __m512i row_off,
                                                      __mmask16 mask, const FastActOne& x, int64_t b) {
    constexpr size_t bs = sizeof(typename LegacyBlocks<K>::W);
    // d (| m << 16) of the 16 rows (rows past the mask read as 0 and are not stored)
    const __m512i head = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, row_off, row0 + b * bs, 1);
    if constexpr (!kHasMin<K>) ai = _mm512_add_epi32(ai, _mm512_set1_epi32(x.n[b]));
    acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ai), half_lo(head)), _mm512_set1_ps(x.d[b]), acc);
    if constexpr (kHasMin<K>) acc = _mm512_fmadd_ps(half_hi(head), _mm512_set1_ps(x.s[b]), acc);
}

template <Legacy K>
void gemv(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* act, int64_t o_begin, int64_t o_end, float* y) {
    const int64_t nb = n_in / 32, full = nb / 16 * 16, n_tail = (nb - full + 1) / 2;
    const FastActOne x = fast_gemv_act(act, n_in);
    alignas(64) int32_t off[kRows];
    for (int r = 0; r < kRows; ++r) off[r] = int32_t(r * w_row);
    const __m512i row_off = _mm512_load_si512(off);
    // Per row group: [row][full blocks] chunk sums, then [tail pair][row][16] pair vectors.
    thread_local std::vector<int32_t> buf;
    buf.resize(size_t(kRows * full + n_tail * kRows * 16));
    int32_t* const tail = buf.data() + kRows * full;
    for (int64_t o = o_begin; o < o_end; o += kRows) {
        const int n_rows = int(std::min<int64_t>(kRows, o_end - o));
        const __mmask16 mask = __mmask16((1u << n_rows) - 1);
        const uint8_t* row0 = w + o * w_row;
        for (int r = 0; r < n_rows; ++r) gemv_row<K>(row0 + r * w_row, nb, x.q, buf.data() + r * full, tail + 16 * r);
        if (n_rows < kRows) {   // rows past the last: zero sums (their lanes are not stored)
            std::fill_n(buf.data() + n_rows * full, (kRows - n_rows) * full, 0);
            for (int64_t p = 0; p < n_tail; ++p)
                std::fill_n(tail + (p * kRows + n_rows) * 16, (kRows - n_rows) * 16, 0);
        }
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b0 = 0; b0 < full; b0 += 16) {
            __m512i s[16];
#pragma GCC unroll 16
            for (int r = 0; r < kRows; ++r) s[r] = _mm512_loadu_si512(buf.data() + r * full + b0);
            transpose16(s);   // s[l]: lane l of every row
#pragma GCC unroll 16
            for (int j = 0; j < 16; ++j) gemv_block<K>(acc, s[gemv_lane(j)], row0, row_off, mask, x, b0 + j);
        }
        for (int64_t p = 0; p < n_tail; ++p) {
            __m512i q[16], even, odd;
#pragma GCC unroll 16
            for (int r = 0; r < kRows; ++r) q[r] = _mm512_loadu_si512(tail + (p * kRows + r) * 16);
            pair_sums16(q, even, odd);
            const int64_t b = full + 2 * p;
            gemv_block<K>(acc, even, row0, row_off, mask, x, b);
            if (b + 1 < nb) gemv_block<K>(acc, odd, row0, row_off, mask, x, b + 1);
        }
        _mm512_mask_storeu_ps(y + o, mask, acc);
    }
}

const FastGemm kQ4_0{gemm_fast<LegacyKernel<Legacy::q4_0>>, gemv<Legacy::q4_0>, kRows, GGMLType::Q8_0, 8};
const FastGemm kQ4_1{gemm_fast<LegacyKernel<Legacy::q4_1>>, gemv<Legacy::q4_1>, kRows, GGMLType::Q8_1, 0};
const FastGemm kQ8_0{gemm_fast<LegacyKernel<Legacy::q8_0>>, gemv<Legacy::q8_0>, kRows, GGMLType::Q8_0, 128};
const FastGemm kQ4_K{gemm_fast<Q45KKernel<false>>, nullptr, kRows, GGMLType::Q8_K, 0};
const FastGemm kQ5_K{gemm_fast<Q45KKernel<true>>, nullptr, kRows, GGMLType::Q8_K, 0};
const FastGemm kQ6_K{gemm_fast<Q6KKernel>, nullptr, kRows, GGMLType::Q8_K, 32};

}  // namespace

const FastGemm* fast_gemm_avx512_for(GGMLType type) {
    switch (type) {
        case GGMLType::Q4_0: return &kQ4_0;
        case GGMLType::Q4_1: return &kQ4_1;
        case GGMLType::Q8_0: return &kQ8_0;
        case GGMLType::Q4_K: return &kQ4_K;
        case GGMLType::Q5_K: return &kQ5_K;
        case GGMLType::Q6_K: return &kQ6_K;
        default: return nullptr;
    }
}

}  // namespace ember
