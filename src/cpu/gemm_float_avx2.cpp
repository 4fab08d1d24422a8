// AVX2 tiles of 2 weight rows x 3 tokens for F32, F16 and BF16 weights (F32 activations). Each
// output keeps vec_dot_avx2.cpp's two accumulators, its horizontal sum and its scalar tail, so it
// is bit-identical to that dot; a weight vector is converted once for the tile's tokens.
#include <immintrin.h>

#include <cstring>

#include "cpu/gemm.h"
#include "cpu/isa_kernels.h"
#include "cpu/simd_avx2.h"

namespace ember {
namespace {

using namespace avx2;

constexpr int R = 2, C = 3;   // 12 ymm accumulators, 2 weight vectors and 1 activation vector

template <int Kind>   // 0: F32, 1: F16, 2: BF16
inline __m256 load_weights8(const void* w, int64_t i) {
    if constexpr (Kind == 0) return _mm256_loadu_ps(static_cast<const float*>(w) + i);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (Kind == 1) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int Kind>
inline float weight_at(const void* w, int64_t i) {
    if constexpr (Kind == 0) return static_cast<const float*>(w)[i];
    const uint16_t h = static_cast<const uint16_t*>(w)[i];
    if constexpr (Kind == 1) return h2f(h);
    else {
        const uint32_t u = uint32_t(h) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
}

template <int Kind>
void tile(int64_t n, const uint8_t* const* wr, const uint8_t* const* xt, float* y, int64_t n_out) {
    const float* x[C];
    for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const float*>(xt[c]);
    __m256 a0[R][C], a1[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) a0[r][c] = a1[r][c] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w[R];
        for (int r = 0; r < R; ++r) w[r] = load_weights8<Kind>(wr[r], i);
        for (int c = 0; c < C; ++c) {
            const __m256 xv = _mm256_loadu_ps(x[c] + i);
            for (int r = 0; r < R; ++r) a0[r][c] = _mm256_fmadd_ps(w[r], xv, a0[r][c]);
        }
        for (int r = 0; r < R; ++r) w[r] = load_weights8<Kind>(wr[r], i + 8);
        for (int c = 0; c < C; ++c) {
            const __m256 xv = _mm256_loadu_ps(x[c] + i + 8);
            for (int r = 0; r < R; ++r) a1[r][c] = _mm256_fmadd_ps(w[r], xv, a1[r][c]);
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) {
            float s = hsum_ps(_mm256_add_ps(a0[r][c], a1[r][c]));
            for (int64_t j = i; j < n; ++j) s += weight_at<Kind>(wr[r], j) * x[c][j];
            y[c * n_out + r] = s;
        }
}

template <int Kind>
void gemm_float(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok,
                int64_t o_begin, int64_t o_end, float* y, int64_t n_out) {
    static const VecDotFn dot = vec_dot_avx2(Kind == 0 ? GGMLType::F32 : Kind == 1 ? GGMLType::F16 : GGMLType::BF16);
    run_tiles<R, C>(
        n_in, w, w_row, x, x_row, n_tok, o_begin, o_end, y, n_out, dot, [](const uint8_t* const*) {},
        [&](const uint8_t* const* wr, const uint8_t* const* xt, float* yt) { tile<Kind>(n_in, wr, xt, yt, n_out); });
}

}  // namespace

GemmFn gemm_float_avx2_for(VecDotFn dot) {
    static const GemmEntry kTiles[] = {
        {GGMLType::F32, gemm_float<0>},
        {GGMLType::F16, gemm_float<1>},
        {GGMLType::BF16, gemm_float<2>},
    };
    return gemm_lookup(dot, vec_dot_avx2, kTiles);
}

}  // namespace ember
