// expf of 8 floats with AVX2, in double as glibc's FMA build computes it (x / ln2 = (k + r) / 32,
// exp(x) = 2^(k/32) * p(r): the table of 2^(i/32) and the cubic of cuda/common.cuh's expf_glibc,
// whose bits it shares, as cpu/expf_avx512.h at half the width), so the results are std::exp's
// bits. For AVX2 files built with -ffp-contract=off only; internal linkage, like the kernels that
// use it.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/expf_table.h"

namespace ember {
namespace {

alignas(32) const uint64_t kExp2Table[32] = EMBER_EXPF_TABLE;   // bits of 2^(i/32) minus i << 47

// Four floats' expf through doubles.
__m128 expf4_avx2(__m128 xf) {
    const __m256d z = _mm256_mul_pd(_mm256_set1_pd(kExpfInvLn2N), _mm256_cvtps_pd(xf));
    const __m256d shift = _mm256_set1_pd(kExpfShift);
    const __m256d kd = _mm256_add_pd(z, shift);   // rounds z to an integer k in the low bits
    const __m256i ki = _mm256_castpd_si256(kd);
    const __m256d r = _mm256_sub_pd(z, _mm256_sub_pd(kd, shift));
    const __m256i bits = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kExp2Table),
                                                _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(bits, _mm256_slli_epi64(ki, 47)));
    const __m256d c0 = _mm256_set1_pd(kExpfC0), c1 = _mm256_set1_pd(kExpfC1), c2 = _mm256_set1_pd(kExpfC2);
    const __m256d p = _mm256_fmadd_pd(_mm256_fmadd_pd(c0, r, c1), _mm256_mul_pd(r, r),
                                      _mm256_fmadd_pd(c2, r, _mm256_set1_pd(1.0)));
    return _mm256_cvtpd_ps(_mm256_mul_pd(p, s));
}

// expf of 8 floats, glibc's special cases included: NaN stays NaN, above kExpfOverflow is +inf,
// below kExpfUnderflow 0.
__m256 expf8_avx2(__m256 x) {
    __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(expf4_avx2(_mm256_castps256_ps128(x))),
                                    expf4_avx2(_mm256_extractf128_ps(x, 1)), 1);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(kExpfOverflow), _CMP_GT_OQ));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(kExpfUnderflow), _CMP_LT_OQ));
    return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

}  // namespace
}  // namespace ember
