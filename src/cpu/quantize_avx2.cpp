// AVX2 activation quantizers (Q8_0, Q8_1): the same bytes as the scalar quantize_row_q8_0 /
// _q8_1 (quant_legacy.cpp), as quantize_avx512.cpp does with 16-wide vectors.
#include <immintrin.h>

#include "cpu/quantize_q8_rows.h"

namespace ember {
namespace {

// roundf: halves away from zero. v - trunc(v) is exact for |v| < 2^23, so the test is exact.
inline __m256 round_half_away(__m256 v) {
    const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    return _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(_mm256_set1_ps(1.0f), sign)));
}

inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

inline int hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// One block of 32 (the scalar formulas, in the same float steps); returns d, or a negative value
// when the block is not finite (the caller goes scalar).
inline float block_q8(const float* x, int8_t* q, int* sum) {
    __m256 v[4], amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[k]));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
    }
    const float m = hmax(amax);
    const float d = m / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (_mm256_movemask_ps(nan) || !(m <= 3.4028235e38f) || !(id <= 3.4028235e38f)) return -1.0f; // NaN / inf in or out
    __m256i qi[4];
    for (int k = 0; k < 4; ++k) qi[k] = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v[k], _mm256_set1_ps(id))));
    *sum = hsum(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
    // int32 -> int8 (no saturation: |q| <= 127); packs work per 128-bit lane, the permute undoes that
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return d;
}

} // namespace

QuantizeRowFn quantize_row_avx2(GGMLType type) { return q8_row_quantizer<block_q8>(type); }

} // namespace ember
