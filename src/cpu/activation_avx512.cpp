// Gated activations (SiLU, GeLU-tanh, gpt-oss's clamped SwiGLU) 16 floats a step with AVX-512: expf as glibc's FMA build
// computes it (cpu/expf_avx512.h), then the float steps of CpuBackend::gated_act in its order:
// the scalar loop's results, and the CUDA kernel's.
// (No FMA contraction in this file: CMakeLists.txt compiles it with -ffp-contract=off.)
#include <immintrin.h>

#include "cpu/expf_avx512.h"
#include "cpu/isa_kernels.h"

namespace ember {

void gated_act_avx512(Activation act, const float* gate, const float* up, int64_t n, float* out) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i), u = _mm512_loadu_ps(up + i);
        __m512 arg; // exp's argument
        if (act == Activation::SiLU) {
            arg = _mm512_xor_ps(g, _mm512_set1_ps(-0.0f)); // -g, as the scalar loop negates
        } else if (act == Activation::SwiGLUClamped) {
            // std::min / std::max's operand order: a NaN gate or up stays NaN, as in the scalar loop
            g = _mm512_min_ps(_mm512_set1_ps(kSwiGLULimit), g);
            u = _mm512_add_ps(
                _mm512_max_ps(_mm512_set1_ps(-kSwiGLULimit), _mm512_min_ps(_mm512_set1_ps(kSwiGLULimit), u)), one);
            arg = _mm512_mul_ps(_mm512_set1_ps(-kSwiGLUAlpha), g);
        } else {
            const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), g), g), g);
            arg = _mm512_mul_ps(_mm512_set1_ps(-1.5957691216057308f), _mm512_add_ps(g, cube));
        }
        const __m512 y = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, exp16(arg))), u);
        _mm512_storeu_ps(out + i, y);
    }
    gated_act_scalar(act, gate + i, up + i, n - i, out + i);
}

} // namespace ember
