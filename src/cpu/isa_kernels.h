// The per-ISA kernel lookups the CPU kernel table (cpu_kernels.cpp) is built from: dot products
// (vec_dot_*.cpp) and activation quantizers (quantize_*.cpp), each nullptr where that ISA has none.
#pragma once
#include "backend/backend.h"
#include "cpu/cpu_kernels.h"

namespace ember {

// Scalar reference dot products (weights type x its vec_dot_type), defined for every type.
VecDotFn vec_dot_scalar(GGMLType type);
// SIMD kernels; nullptr where that ISA has no kernel for the type (the caller falls back).
VecDotFn vec_dot_avx2(GGMLType type);
VecDotFn vec_dot_avx512(GGMLType type);
VecDotFn vec_dot_neon(GGMLType type);   // ARM64 (nullptr on other targets)
// The ternary, 1-bit and NVFP4 types' SIMD dots (vec_dot_low_bit_*.cpp), which the lookups above
// answer with.
VecDotFn vec_dot_low_bit_avx2(GGMLType type);
VecDotFn vec_dot_low_bit_avx512(GGMLType type);
VecDotFn vec_dot_low_bit_neon(GGMLType type);
// Q2_K's and Q3_K's SIMD dots (vec_dot_q2_q3_*.cpp), which the lookups above answer with.
VecDotFn vec_dot_q2_q3_avx2(GGMLType type);
VecDotFn vec_dot_q2_q3_avx512(GGMLType type);
VecDotFn vec_dot_q2_q3_neon(GGMLType type);
// Activation quantizers with the scalar quantize_row_* output, byte for byte.
QuantizeRowFn quantize_row_avx2(GGMLType type);
QuantizeRowFn quantize_row_avx512(GGMLType type);
QuantizeRowFn quantize_row_neon(GGMLType type);   // ARM64 (nullptr on other targets)
// out[i] = act(gate[i]) * up[i] (out may be gate or up): the scalar reference, and AVX2 and AVX-512
// with its bits (the scalar loop where the target has no x86 SIMD).
void gated_act_scalar(Activation act, const float* gate, const float* up, int64_t n, float* out);
// Activation::SwiGLUClamped's clamp and sigmoid slope (gpt-oss's).
constexpr float kSwiGLULimit = 7.0f, kSwiGLUAlpha = 1.702f;
void gated_act_avx2(Activation act, const float* gate, const float* up, int64_t n, float* out);
void gated_act_avx512(Activation act, const float* gate, const float* up, int64_t n, float* out);
using GatedActFn = void (*)(Activation act, const float* gate, const float* up, int64_t n, float* out);
// The gated activation of a SIMD level (every level gives the same bits).
inline GatedActFn gated_act_kernel(SimdLevel level) {
    return level == SimdLevel::avx512 ? gated_act_avx512 : level == SimdLevel::avx2 ? gated_act_avx2 : gated_act_scalar;
}

}  // namespace ember
