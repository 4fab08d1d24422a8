// Targets without x86 SIMD (ARM and others): the *_avx2.cpp / *_avx512.cpp kernel files are not
// built there (CMakeLists.txt), and their lookups answer "none", so each type gets the target's own
// kernels (the *_neon.cpp files on ARM64) or the scalar ones.
#if !(defined(__x86_64__) || defined(__i386__))
#include "cpu/attention_math.h"
#include "cpu/gemm.h"
#include "cpu/gemm_fast.h"
#include "cpu/isa_kernels.h"

namespace ember {

VecDotFn vec_dot_avx2(GGMLType) { return nullptr; }
VecDotFn vec_dot_avx512(GGMLType) { return nullptr; }
QuantizeRowFn quantize_row_avx2(GGMLType) { return nullptr; }
QuantizeRowFn quantize_row_avx512(GGMLType) { return nullptr; }
GemmFn gemm_avx2_for(VecDotFn) { return nullptr; }
GemmFn gemm_avx512_for(VecDotFn) { return nullptr; }
GemmFn gemm_float_avx2_for(VecDotFn) { return nullptr; }
GemmFn gemm_float_avx512_for(VecDotFn) { return nullptr; }
const FastGemm* fast_gemm_avx2_for(GGMLType) { return nullptr; }
const FastGemm* fast_gemm_avx512_for(GGMLType) { return nullptr; }
void gated_act_avx2(Activation act, const float* gate, const float* up, int64_t n, float* out) {
    gated_act_scalar(act, gate, up, n, out);
}
void gated_act_avx512(Activation act, const float* gate, const float* up, int64_t n, float* out) {
    gated_act_scalar(act, gate, up, n, out);
}
const AttentionMath kAttentionMathAvx2 = kAttentionMathScalar;
const AttentionMath kAttentionMathAvx512 = kAttentionMathScalar;

}  // namespace ember
#endif
