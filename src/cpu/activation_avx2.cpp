// Gated activations (SiLU, GeLU-tanh, gpt-oss's clamped SwiGLU) 8 floats a step with AVX2: expf as
// glibc's FMA build computes it (cpu/expf_avx2.h), then the float steps of CpuBackend::gated_act
// in its order: the scalar loop's results, and the CUDA kernel's.
// (No FMA contraction in this file: CMakeLists.txt compiles it with -ffp-contract=off.)
#include <immintrin.h>

#include "cpu/expf_avx2.h"
#include "cpu/isa_kernels.h"

namespace ember {

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
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, expf8_avx2(arg))), u));
    }
    gated_act_scalar(act, gate + i, up + i, n - i, out + i);
}

}  // namespace ember
