// The SIMD attention arithmetic (attention_math.h), written once on 16-float GCC vectors:
// attention_math_avx2.cpp and attention_math_avx512.cpp include it under their ISA flags, and
// GCC lowers each vector op to two ymm or one zmm instruction. Lane l of a vector holds what
// iteration l of the scalar loop computes, with the same operations in the same order.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "cpu/attention_math.h"

namespace ember {
namespace attention_simd {
namespace {   // each including file gets its own copies, built for its ISA

typedef float v16 __attribute__((vector_size(64)));

inline v16 load(const float* p) {
    v16 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }

// f16 <-> f32 of 16 values (F16C, round to nearest even: the scalar float_to_half's result).
inline v16 from_f16(const uint16_t* p) {
    v16 v;
#if defined(__AVX512F__)
    const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    std::memcpy(&v, &f, sizeof v);
#else
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
    std::memcpy(&v, &lo, 32);
    std::memcpy(reinterpret_cast<char*>(&v) + 32, &hi, 32);
#endif
    return v;
}

inline v16 round_f16(v16 v) {
    alignas(32) uint16_t h[16];
#if defined(__AVX512F__)
    __m512 f;
    std::memcpy(&f, &v, sizeof v);
    _mm256_store_si256(reinterpret_cast<__m256i*>(h), _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
    __m256 lo, hi;
    std::memcpy(&lo, &v, 32);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + 32, 32);
    _mm_store_si128(reinterpret_cast<__m128i*>(h), _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT));
    _mm_store_si128(reinterpret_cast<__m128i*>(h + 8), _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT));
#endif
    return from_f16(h);
}

// Four key groups at a time: four independent sums hide the add latency; each lane's sum
// still runs over i in order.
inline void scores(const float* q, const float* kt, int32_t D, int32_t n_groups, float scale, float* prob) {
    constexpr int L = kAttentionLanes;
    int32_t g = 0;
    for (; g + 4 <= n_groups; g += 4) {
        const float* k = kt + (int64_t)g * D * L;
        v16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
        for (int32_t i = 0; i < D; ++i) {
            const float qi = q[i];
            a0 = a0 + load(k + i * L) * qi;
            a1 = a1 + load(k + (D + i) * L) * qi;
            a2 = a2 + load(k + (2 * D + i) * L) * qi;
            a3 = a3 + load(k + (3 * D + i) * L) * qi;
        }
        store(prob + g * L, a0 * scale);
        store(prob + (g + 1) * L, a1 * scale);
        store(prob + (g + 2) * L, a2 * scale);
        store(prob + (g + 3) * L, a3 * scale);
    }
    for (; g < n_groups; ++g) {
        const float* k = kt + (int64_t)g * D * L;
        v16 a = {};
        for (int32_t i = 0; i < D; ++i) a = a + load(k + i * L) * q[i];
        store(prob + g * L, a * scale);
    }
}

inline void scale_round(const float* x, int32_t n, float mul, bool to_f16, float* y) {
    int32_t j = 0;
    for (; j + 16 <= n; j += 16) {
        const v16 v = load(x + j) * mul;
        store(y + j, to_f16 ? round_f16(v) : v);
    }
    alignas(64) float tail[16] = {};
    std::memcpy(tail, x + j, sizeof(float) * (n - j));
    const v16 v = load(tail) * mul;
    store(tail, to_f16 ? round_f16(v) : v);
    std::memcpy(y + j, tail, sizeof(float) * (n - j));
}

// D % 16 == 0. Up to 64 output elements (four vectors) per pass over the positions.
inline void weighted_sum(const float* w, const float* v, int32_t D, int32_t len, float* o) {
    int32_t c = 0;
    for (; c + 64 <= D; c += 64) {
        v16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
        for (int32_t p = 0; p < len; ++p) {
            const float* r = v + (int64_t)p * D + c;
            const float wp = w[p];
            a0 = a0 + load(r) * wp;
            a1 = a1 + load(r + 16) * wp;
            a2 = a2 + load(r + 32) * wp;
            a3 = a3 + load(r + 48) * wp;
        }
        store(o + c, a0);
        store(o + c + 16, a1);
        store(o + c + 32, a2);
        store(o + c + 48, a3);
    }
    for (; c < D; c += 16) {
        v16 a = {};
        for (int32_t p = 0; p < len; ++p) a = a + load(v + (int64_t)p * D + c) * w[p];
        store(o + c, a);
    }
}

inline void f16_to_f32(const uint16_t* src, int32_t n, float* dst) {
    int32_t j = 0;
    for (; j + 16 <= n; j += 16) store(dst + j, from_f16(src + j));
    alignas(32) uint16_t tail[16] = {};
    std::memcpy(tail, src + j, sizeof(uint16_t) * (n - j));
    const v16 v = from_f16(tail);
    std::memcpy(dst + j, &v, sizeof(float) * (n - j));
}

}  // namespace
}  // namespace attention_simd
}  // namespace ember
