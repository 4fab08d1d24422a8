// AVX-512 activation quantizers (Q8_0, Q8_1, Q8_K): the same bytes as the scalar quantize_row_q8_0
// / _q8_1 (quant_legacy.cpp) and quantize_row_q8_k (quant_kquants.cpp) for every finite input,
// 16 values per instruction instead of a libm call or a scalar loop each. A prompt's activations
// are quantized once per matmul, a visible share of prefill on small models (docs/performance.md).
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "cpu/quantize_q8_rows.h"

namespace ember {
namespace {

// roundf: halves away from zero. v - trunc(v) is exact for |v| < 2^23, so the test is exact.
inline __m512 round_half_away(__m512 v) {
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));   // +-1 as v
    return _mm512_mask_add_ps(t, up, t, one);
}

// One block of 32: q = round(x / d) with d = amax / 127 (the scalar formulas, in the same float
// steps); returns d, or a negative value when the block is not finite (the caller goes scalar).
inline float block_q8(const float* x, int8_t* q, int* sum) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __mmask16 nan = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
    if (nan || !(amax <= 3.4028235e38f) || !(id <= 3.4028235e38f)) return -1.0f;   // NaN / inf in or out
    const __m512i q0 = _mm512_cvtps_epi32(round_half_away(_mm512_mul_ps(v0, _mm512_set1_ps(id))));
    const __m512i q1 = _mm512_cvtps_epi32(round_half_away(_mm512_mul_ps(v1, _mm512_set1_ps(id))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    return d;
}

// Q8_K, one super-block of 256: iscale = -127 / (the first value of largest magnitude), q =
// nearest-even(iscale * x) capped at 127, bsums of 16. Blocks with a NaN or an infinity, or whose
// scale overflows, go through the scalar code.
void q8_k_rows(const float* src, void* dst, int64_t n) {
    BlockQ8_K* b = static_cast<BlockQ8_K*>(dst);
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        __m512 v[16];
        __m512 amax = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int j = 0; j < 16; ++j) {
            v[j] = _mm512_loadu_ps(src + 16 * j);
            const __m512 a = _mm512_abs_ps(v[j]);
            bad |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.4028235e38f), _CMP_NLE_UQ);   // inf or NaN
            amax = _mm512_max_ps(amax, a);
        }
        const float am = _mm512_reduce_max_ps(amax);
        if (bad || am == 0.0f) {   // (an all-zero block: the scalar code writes zeros)
            quantize_row_q8_k(src, &b[i], QK_K);
            continue;
        }
        int first = 0;   // the scalar loop keeps the first value of largest magnitude
        for (int j = 0; j < 16; ++j) {
            const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(v[j]), _mm512_set1_ps(am), _CMP_EQ_OQ);
            if (m) {
                first = 16 * j + __builtin_ctz(m);
                break;
            }
        }
        const float iscale = -127.0f / src[first];
        if (!(std::fabs(iscale) <= 3.4028235e38f)) {
            quantize_row_q8_k(src, &b[i], QK_K);
            continue;
        }
        for (int j = 0; j < 16; ++j) {
            // cvtps_epi32 rounds to nearest even, as nearest() does for |v| <= 127
            const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v[j], _mm512_set1_ps(iscale))),
                                               _mm512_set1_epi32(127));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16 * j), _mm512_cvtepi32_epi8(q));
            b[i].bsums[j] = int16_t(_mm512_reduce_add_epi32(q));
        }
        b[i].d = 1.0f / iscale;
    }
}

}  // namespace

QuantizeRowFn quantize_row_avx512(GGMLType type) {
    return type == GGMLType::Q8_K ? q8_k_rows : q8_row_quantizer<block_q8>(type);
}

}  // namespace ember
