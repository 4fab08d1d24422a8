// expf of 16 floats with AVX-512, in double as glibc's FMA build computes it (x / ln2 = (k + r) / 32,
// exp(x) = 2^(k/32) * p(r): the table of 2^(i/32) and the cubic of cuda/common.cuh's expf_glibc,
// whose bits it shares), so the results are std::exp's bits. For AVX-512 files built with
// -ffp-contract=off only; internal linkage, like the kernels that use it.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/expf_table.h"

namespace ember {
namespace {

alignas(64) const uint64_t kExp2Table[32] = EMBER_EXPF_TABLE;   // bits of 2^(i/32) minus i << 47

// Eight floats' expf through doubles.
__m256 exp8(__m256 xf) {
    const __m512d z = _mm512_mul_pd(_mm512_set1_pd(kExpfInvLn2N), _mm512_cvtps_pd(xf));
    const __m512d shift = _mm512_set1_pd(kExpfShift);
    const __m512d kd = _mm512_add_pd(z, shift);   // rounds z to an integer k in the low bits
    const __m512i ki = _mm512_castpd_si512(kd);
    const __m512d r = _mm512_sub_pd(z, _mm512_sub_pd(kd, shift));
    // table[k % 32]: two 16-entry permutes (index bits 0-3), picked by bit 4
    const __m512i* t = reinterpret_cast<const __m512i*>(kExp2Table);
    const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    const __m512i lo = _mm512_permutex2var_epi64(_mm512_load_si512(t), idx, _mm512_load_si512(t + 1));
    const __m512i hi = _mm512_permutex2var_epi64(_mm512_load_si512(t + 2), idx, _mm512_load_si512(t + 3));
    const __m512i bits = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), lo, hi);
    const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(bits, _mm512_slli_epi64(ki, 47)));
    const __m512d c0 = _mm512_set1_pd(kExpfC0), c1 = _mm512_set1_pd(kExpfC1), c2 = _mm512_set1_pd(kExpfC2);
    const __m512d p = _mm512_fmadd_pd(_mm512_fmadd_pd(c0, r, c1), _mm512_mul_pd(r, r),
                                      _mm512_fmadd_pd(c2, r, _mm512_set1_pd(1.0)));
    return _mm512_cvtpd_ps(_mm512_mul_pd(p, s));
}

// expf of 16 floats, glibc's special cases included: NaN stays NaN, above kExpfOverflow is +inf,
// below kExpfUnderflow 0.
__m512 exp16(__m512 x) {
    __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(exp8(_mm512_castps512_ps256(x))),
                                  exp8(_mm512_extractf32x8_ps(x, 1)), 1);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpfOverflow), _CMP_GT_OQ), y,
                             _mm512_set1_ps(INFINITY));
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpfUnderflow), _CMP_LT_OQ), y, _mm512_setzero_ps());
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, _mm512_add_ps(x, x));
}

}  // namespace
}  // namespace ember
