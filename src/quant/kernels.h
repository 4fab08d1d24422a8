// Private declarations of the per-type row functions (scalar reference, in src/quant) and the
// per-ISA vec_dot kernel tables (src/cpu/vec_dot_*.cpp). traits.cpp wires them into the table.
#pragma once
#include <cstdint>

#include "ember/quant.h"

namespace ember {

// Dequantize (n elements, a whole number of blocks).
void dequantize_row_f32(const void* src, float* dst, int64_t n);
void dequantize_row_f16(const void* src, float* dst, int64_t n);
void dequantize_row_bf16(const void* src, float* dst, int64_t n);
void dequantize_row_q4_0(const void* src, float* dst, int64_t n);
void dequantize_row_q4_1(const void* src, float* dst, int64_t n);
void dequantize_row_q5_0(const void* src, float* dst, int64_t n);
void dequantize_row_q5_1(const void* src, float* dst, int64_t n);
void dequantize_row_q8_0(const void* src, float* dst, int64_t n);
void dequantize_row_q8_1(const void* src, float* dst, int64_t n);
void dequantize_row_q2_k(const void* src, float* dst, int64_t n);
void dequantize_row_q3_k(const void* src, float* dst, int64_t n);
void dequantize_row_q4_k(const void* src, float* dst, int64_t n);
void dequantize_row_q5_k(const void* src, float* dst, int64_t n);
void dequantize_row_q6_k(const void* src, float* dst, int64_t n);
void dequantize_row_q8_k(const void* src, float* dst, int64_t n);

// Quantize (n elements, a whole number of blocks).
void quantize_row_f32(const float* src, void* dst, int64_t n);
void quantize_row_f16(const float* src, void* dst, int64_t n);
void quantize_row_bf16(const float* src, void* dst, int64_t n);
void quantize_row_q4_0(const float* src, void* dst, int64_t n);
void quantize_row_q4_1(const float* src, void* dst, int64_t n);
void quantize_row_q5_0(const float* src, void* dst, int64_t n);
void quantize_row_q5_1(const float* src, void* dst, int64_t n);
void quantize_row_q8_0(const float* src, void* dst, int64_t n);
void quantize_row_q8_1(const float* src, void* dst, int64_t n);
void quantize_row_q4_k(const float* src, void* dst, int64_t n);
void quantize_row_q5_k(const float* src, void* dst, int64_t n);
void quantize_row_q6_k(const float* src, void* dst, int64_t n);
void quantize_row_q8_k(const float* src, void* dst, int64_t n);

// Scalar reference dot products (weights type x its vec_dot_type); src/cpu/vec_dot_scalar.cpp.
VecDotFn vec_dot_scalar(GGMLType type);
// SIMD kernels; nullptr where that ISA has no kernel for the type (the caller falls back).
VecDotFn vec_dot_avx2(GGMLType type);
VecDotFn vec_dot_avx512(GGMLType type);

}  // namespace ember
