// Gated activations (SiLU, GeLU-tanh, gpt-oss's clamped SwiGLU) 8 floats a step with AVX2: expf as
// glibc's FMA build computes it (in double, as cpu/expf_avx512.h does: x / ln2 = (k + r) / 32,
// exp(x) = 2^(k/32) * p(r)), then the float steps of CpuBackend::gated_act in its order: the scalar
// loop's results, and the CUDA kernel's.
// (No FMA contraction in this file: CMakeLists.txt compiles it with -ffp-contract=off.)
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/expf_table.h"
#include "cpu/isa_kernels.h"

namespace ember {
namespace {

alignas(32) const uint64_t kExp2Table[32] = EMBER_EXPF_TABLE;   // bits of 2^(i/32) minus i << 47

// Four floats' expf through doubles.
__m128 exp4(__m128 xf) {
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
__m256 exp8(__m256 x) {
    __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(exp4(_mm256_castps256_ps128(x))),
                                    exp4(_mm256_extractf128_ps(x, 1)), 1);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(kExpfOverflow), _CMP_GT_OQ));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(kExpfUnderflow), _CMP_LT_OQ));
    return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

}  // namespace

void gated_act_avx2(Activation act, const float* gate, const float* up, int64_t n, float* out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
        __m256 arg;   // exp's argument
        if (act == Activation::SiLU) {
            arg = _mm256_xor_ps(g, _mm256_set1_ps(-0.0f));   // -g, as the scalar loop negates
        } else if (act == Activation::SwiGLUClamped) {
            // std::min / std::max's operand order: a NaN gate or up stays NaN, as in the scalar loop
            g = _mm256_min_ps(_mm256_set1_ps(kSwiGLULimit), g);
            u = _mm256_add_ps(
                _mm256_max_ps(_mm256_set1_ps(-kSwiGLULimit), _mm256_min_ps(_mm256_set1_ps(kSwiGLULimit), u)), one);
            arg = _mm256_mul_ps(_mm256_set1_ps(-kSwiGLUAlpha), g);
        } else {
            const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), g), g), g);
            arg = _mm256_mul_ps(_mm256_set1_ps(-1.5957691216057308f), _mm256_add_ps(g, cube));
        }
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, exp8(arg))), u));
    }
    gated_act_scalar(act, gate + i, up + i, n - i, out + i);
}

}  // namespace ember
