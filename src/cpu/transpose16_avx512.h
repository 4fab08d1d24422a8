// The 16 x 16 transpose of sixteen AVX-512 registers, shared by the attention's key gather
// (attention_math_simd.h) and the one-token GEMV's block sums (gemm_fast_avx512.cpp). For
// AVX-512 files only; internal linkage, like the kernels that use it, so no build of the same name
// for another ISA can stand in for it at link time.
#pragma once
#include <immintrin.h>

namespace ember {
namespace {

// r[j] = column j of the 16x16 matrix whose rows were r[0..16).
inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int a = 0; a < 16; a += 2) {
        t[a] = _mm512_unpacklo_ps(r[a], r[a + 1]);       // per 128-bit lane: a0 b0 a1 b1
        t[a + 1] = _mm512_unpackhi_ps(r[a], r[a + 1]);   // a2 b2 a3 b3
    }
#pragma GCC unroll 4
    for (int a = 0; a < 16; a += 4) {   // u[a + j], 128-bit lane k: rows a..a+3 at column 4k + j
        u[a] = _mm512_shuffle_ps(t[a], t[a + 2], 0x44);
        u[a + 1] = _mm512_shuffle_ps(t[a], t[a + 2], 0xEE);
        u[a + 2] = _mm512_shuffle_ps(t[a + 1], t[a + 3], 0x44);
        u[a + 3] = _mm512_shuffle_ps(t[a + 1], t[a + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);   // u[j] lanes 0 2, u[4+j] lanes 0 2
        const __m512 v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);   // lanes 1 3
        const __m512 w0 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
        const __m512 w1 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
        r[j] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        r[4 + j] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
        r[12 + j] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
}

// The same for int32 lanes (the casts are free).
inline void transpose16(__m512i (&r)[16]) {
    __m512 f[16];
    for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(r[i]);
    transpose16(f);
    for (int i = 0; i < 16; ++i) r[i] = _mm512_castps_si512(f[i]);
}

}  // namespace
}  // namespace ember
