// Gated activations (SiLU, GeLU-tanh) 16 floats a step with AVX-512. expf runs in double as
// glibc's FMA build computes it (x / ln2 = (k + r) / 32, exp(x) = 2^(k/32) * p(r): the table of
// 2^(i/32) and the cubic of cuda/common.cuh's expf_glibc, whose bits it shares), then the float
// steps of CpuBackend::gated_act in its order: the scalar loop's results, and the CUDA kernel's.
// (No FMA contraction in this file: CMakeLists.txt compiles it with -ffp-contract=off.)
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "cpu/isa_kernels.h"

namespace ember {

namespace {

alignas(64) const uint64_t kExp2Table[32] = {   // bits of 2^(i/32) minus i << 47
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

// Eight floats' expf through doubles.
__m256 exp8(__m256 xf) {
    const __m512d z = _mm512_mul_pd(_mm512_set1_pd(0x1.71547652b82fep+0 * 32), _mm512_cvtps_pd(xf));
    const __m512d shift = _mm512_set1_pd(0x1.8p+52);
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
    const __m512d c0 = _mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), c1 = _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32),
                  c2 = _mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32);
    const __m512d p = _mm512_fmadd_pd(_mm512_fmadd_pd(c0, r, c1), _mm512_mul_pd(r, r), _mm512_fmadd_pd(c2, r, _mm512_set1_pd(1.0)));
    return _mm512_cvtpd_ps(_mm512_mul_pd(p, s));
}

// expf of 16 floats, glibc's special cases included: NaN stays NaN, above 0x1.62e42ep6 is +inf,
// below -0x1.9fe368p6 is 0.
__m512 exp16(__m512 x) {
    __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(exp8(_mm512_castps512_ps256(x))),
                                  exp8(_mm512_extractf32x8_ps(x, 1)), 1);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(0x1.62e42ep6f), _CMP_GT_OQ), y,
                             _mm512_set1_ps(INFINITY));
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-0x1.9fe368p6f), _CMP_LT_OQ), y, _mm512_setzero_ps());
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, _mm512_add_ps(x, x));
}

}  // namespace

void gated_act_avx512(Activation act, const float* gate, const float* up, int64_t n, float* out) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate + i), u = _mm512_loadu_ps(up + i);
        __m512 arg;   // exp's argument
        if (act == Activation::SiLU) {
            arg = _mm512_xor_ps(g, _mm512_set1_ps(-0.0f));   // -g, as the scalar loop negates
        } else {
            const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), g), g), g);
            arg = _mm512_mul_ps(_mm512_set1_ps(-1.5957691216057308f), _mm512_add_ps(g, cube));
        }
        const __m512 y = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, exp16(arg))), u);
        _mm512_storeu_ps(out + i, y);
    }
    gated_act_scalar(act, gate + i, up + i, n - i, out + i);
}

}  // namespace ember
