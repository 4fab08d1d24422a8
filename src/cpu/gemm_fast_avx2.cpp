// AVX2 kernels of the fast batched matmul (gemm_fast.h) for Q4_0, Q4_1 and Q8_0 weights, the
// layout of gemm_fast_avx512.cpp at half the width and without VNNI.
//
// Lane layout: a ymm of 8 int32 lanes holds 8 weight rows of one token. vpmaddubsw multiplies 4
// consecutive (unsigned) weight bytes of each row by the token's 4 activation bytes of those
// elements, broadcast, and adds pairs into int16; vpmaddwd by ones then adds the pairs into the
// int32 lanes. Q4 nibbles (<= 15) times int8 activations (|q| <= 127) keep all 8 int16 sums of a
// block below 2^15, so they are added in int16 and widened once per block. Q8_0 weights are
// signed: their magnitudes are the unsigned operand and their signs move onto the activations
// (vpsignb), each product pair widened on its own (two such pairs may pass 2^15).
//
// Per block, the 8 rows' weight vectors are transposed once (16-byte loads, a 4x4 dword
// transpose per 128-bit lane) into a buffer in L1, then every token of the tile reads them; the
// rows' block heads come in one gather. Q4_0's -8 starts the integer sums at -8 * sum(q_x); the
// Q4_1 min adds m_w * s_x per block.
#include <immintrin.h>

#include <cstddef>
#include <cstring>

#include "cpu/gemm_fast.h"
#include "cpu/gemm_fast_rows.h"
#include "cpu/legacy_blocks.h"
#include "quant/blocks.h"

namespace ember {
namespace {

constexpr int kRows = 8;   // weight rows per ymm (one per int32 lane)

inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// out[j] lane r = dword j of the 16 bytes at row0 + r * stride. Register g holds rows g and 4 + g
// in its 128-bit lanes; the 4x4 dword transpose within the lanes puts row 4k + g in dword 4k + g.
__attribute__((always_inline)) inline void transpose_8x4(const uint8_t* row0, size_t stride, __m256i (&out)[4]) {
    __m256i z[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g)
        z[g] = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(row0 + g * stride)),
                                       load128(row0 + (4 + g) * stride), 1);
    const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm256_unpacklo_epi64(t0, t2);
    out[1] = _mm256_unpackhi_epi64(t0, t2);
    out[2] = _mm256_unpacklo_epi64(t1, t3);
    out[3] = _mm256_unpackhi_epi64(t1, t3);
}

inline __m256i bcast(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// y[t * n_out + r] for the 8 rows at row0 + r * stride (the first n_rows stored) and the T tokens
// of one activation tile. row_off lane r = r * stride; next: the following 8 rows, to prefetch (or
// null).
template <Legacy K, int T>
void rows_tokens(const uint8_t* row0, size_t stride, __m256i row_off, int64_t nb, const FastActBlock* a, float* y,
                 int64_t n_out, int n_rows, const uint8_t* next) {
    using W = typename LegacyBlocks<K>::W;
    constexpr size_t bs = sizeof(W), qs = offsetof(W, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    alignas(32) __m256i wv[8], ws[8];   // unsigned operands; Q8_0: the weights' signs
    __m256 acc[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const size_t o = size_t(b) * bs;
        const FastActBlock& x = a[b];
        const __m256i head = _mm256_i32gather_epi32(reinterpret_cast<const int*>(row0 + o), row_off, 1);
        if (next) {
            const uint8_t* pf = next + o * kRows;
#pragma GCC unroll 8
            for (size_t l = 0; l < (kRows * bs + 63) / 64; ++l)
                _mm_prefetch(reinterpret_cast<const char*>(pf + 64 * l), _MM_HINT_T0);
        }
        __m256i u[4];
        if constexpr (K == Legacy::q8_0) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                transpose_8x4(row0 + o + qs + 16 * h, stride, u);
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j) {
                    ws[4 * h + j] = u[j];
                    wv[4 * h + j] = _mm256_abs_epi8(u[j]);
                }
            }
        } else {
            // qs byte i: element i in the low nibble, element i + 16 in the high one
            transpose_8x4(row0 + o + qs, stride, u);
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                wv[j] = _mm256_and_si256(u[j], m4);
                wv[4 + j] = _mm256_and_si256(_mm256_srli_epi16(u[j], 4), m4);
            }
        }
        // head lane r: d | m << 16 of row r (Q4_0, Q8_0: d and two weight bytes)
        const __m256i words = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(head, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5,
                                                       8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)),
            0xD8);   // qwords 0, 2 (the d words of rows 0-3, 4-7), then 1, 3 (the m words)
        const __m256 dw = _mm256_cvtph_ps(_mm256_castsi256_si128(words));
        const __m256 mw = _mm256_cvtph_ps(_mm256_extracti128_si256(words, 1));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            __m256i ai;
            if constexpr (K == Legacy::q8_0) {
                ai = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) {
                    const __m256i p = _mm256_maddubs_epi16(wv[j], _mm256_sign_epi8(bcast(x.q[t] + 4 * j), ws[j]));
                    ai = _mm256_add_epi32(ai, _mm256_madd_epi16(p, ones));
                }
            } else {
                __m256i p = _mm256_maddubs_epi16(wv[0], bcast(x.q[t]));
#pragma GCC unroll 8
                for (int j = 1; j < 8; ++j) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(wv[j], bcast(x.q[t] + 4 * j)));
                ai = _mm256_madd_epi16(p, ones);
                if constexpr (!kHasMin<K>) ai = _mm256_add_epi32(ai, _mm256_set1_epi32(x.n[t]));
            }
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ai), dw), _mm256_set1_ps(x.d[t]), acc[t]);
            if constexpr (kHasMin<K>) acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.s[t]), acc[t]);
        }
    }
    if (n_rows == kRows) {
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * n_out, acc[t]);
    } else {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n_rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) _mm256_maskstore_ps(y + t * n_out, mask, acc[t]);
    }
}

template <Legacy K>
void gemm_fast(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* act, int32_t n_tok, int64_t o_begin,
               int64_t o_end, float* y, int64_t n_out) {
    const int64_t nb = n_in / 32;
    const __m256i row_off = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                               _mm256_set1_epi32(int32_t(w_row)));
    fast_gemm_rows<kRows>(
        n_in, w, w_row, act, n_tok, o_begin, o_end, y, n_out,
        [&](auto tc, const uint8_t* row0, int n_rows, const FastActBlock* a, float* yt, const uint8_t* next) {
            rows_tokens<K, decltype(tc)::value>(row0, w_row, row_off, nb, a, yt, n_out, n_rows, next);
        });
}

// Q8_0 takes its weights' signs, not an offset: its activations need no sum term.
const FastGemm kQ4_0{gemm_fast<Legacy::q4_0>, nullptr, kRows, GGMLType::Q8_0, 8};
const FastGemm kQ4_1{gemm_fast<Legacy::q4_1>, nullptr, kRows, GGMLType::Q8_1, 0};
const FastGemm kQ8_0{gemm_fast<Legacy::q8_0>, nullptr, kRows, GGMLType::Q8_0, 0};

}  // namespace

const FastGemm* fast_gemm_avx2_for(GGMLType type) {
    switch (type) {
        case GGMLType::Q4_0: return &kQ4_0;
        case GGMLType::Q4_1: return &kQ4_1;
        case GGMLType::Q8_0: return &kQ8_0;
        default: return nullptr;
    }
}

}  // namespace ember
