// AVX-512 tiles of 4 weight rows x 3 tokens for F32, F16 and BF16 weights (F32 activations). Each
// output keeps vec_dot_avx512.cpp's two accumulators and repeats its loads, FMAs, masked tail and
// reduction lane for lane, so it is bit-identical to that dot; a weight vector is converted once
// for the tile's tokens instead of once per token.
#include <immintrin.h>

#include "cpu/gemm.h"
#include "cpu/isa_kernels.h"

namespace ember {
namespace {

constexpr int R = 4, C = 3;   // 24 zmm accumulators, 4 weight vectors and 1 activation vector

template <int Kind>   // 0: F32, 1: F16, 2: BF16
inline __m512 load_weights16(const void* w, int64_t i, __mmask16 m) {
    if constexpr (Kind == 0) {
        return _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + i);
    } else {
        const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(w) + i);
        if constexpr (Kind == 1) return _mm512_cvtph_ps(h);
        else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

template <int Kind>
void tile(int64_t n, const uint8_t* const* wr, const uint8_t* const* xt, float* y, int64_t n_out) {
    const float* x[C];
    for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const float*>(xt[c]);
    __m512 a0[R][C], a1[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) a0[r][c] = a1[r][c] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 w[R];
        for (int r = 0; r < R; ++r) w[r] = load_weights16<Kind>(wr[r], i, 0xFFFF);
        for (int c = 0; c < C; ++c) {
            const __m512 xv = _mm512_loadu_ps(x[c] + i);
            for (int r = 0; r < R; ++r) a0[r][c] = _mm512_fmadd_ps(w[r], xv, a0[r][c]);
        }
        for (int r = 0; r < R; ++r) w[r] = load_weights16<Kind>(wr[r], i + 16, 0xFFFF);
        for (int c = 0; c < C; ++c) {
            const __m512 xv = _mm512_loadu_ps(x[c] + i + 16);
            for (int r = 0; r < R; ++r) a1[r][c] = _mm512_fmadd_ps(w[r], xv, a1[r][c]);
        }
    }
    for (; i < n; i += 16) {
        const int64_t left = n - i;
        const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
        __m512 w[R];
        for (int r = 0; r < R; ++r) w[r] = load_weights16<Kind>(wr[r], i, m);
        for (int c = 0; c < C; ++c) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x[c] + i);
            for (int r = 0; r < R; ++r) a0[r][c] = _mm512_fmadd_ps(w[r], xv, a0[r][c]);
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) y[c * n_out + r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r][c], a1[r][c]));
}

template <int Kind>
void gemm_float(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok,
                int64_t o_begin, int64_t o_end, float* y, int64_t n_out) {
    static const VecDotFn dot = vec_dot_avx512(Kind == 0 ? GGMLType::F32 : Kind == 1 ? GGMLType::F16 : GGMLType::BF16);
    run_tiles<R, C>(
        n_in, w, w_row, x, x_row, n_tok, o_begin, o_end, y, n_out, dot, [](const uint8_t* const*) {},
        [&](const uint8_t* const* wr, const uint8_t* const* xt, float* yt) { tile<Kind>(n_in, wr, xt, yt, n_out); });
}

}  // namespace

GemmFn gemm_float_avx512_for(VecDotFn dot) {
    static const GemmEntry kTiles[] = {
        {GGMLType::F32, gemm_float<0>},
        {GGMLType::F16, gemm_float<1>},
        {GGMLType::BF16, gemm_float<2>},
    };
    return gemm_lookup(dot, vec_dot_avx512, kTiles);
}

}  // namespace ember
