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
// One Q8_0 group of 32 values into q; returns the scale d as f16 bits. Shared by
// quantize_row_q8_0 and the q8_0 KV cache, whose scales are stored apart from the int8 values.
uint16_t quantize_group_q8_0(const float* x, int8_t* q);

// Scalar reference dot products (weights type x its vec_dot_type); src/cpu/vec_dot_scalar.cpp.
VecDotFn vec_dot_scalar(GGMLType type);
// SIMD kernels; nullptr where that ISA has no kernel for the type (the caller falls back).
VecDotFn vec_dot_avx2(GGMLType type);
VecDotFn vec_dot_avx512(GGMLType type);
// Activation quantizers with the scalar quantize_row_* output, byte for byte; nullptr for types
// without one.
QuantizeRowFn quantize_row_avx2(GGMLType type);
QuantizeRowFn quantize_row_avx512(GGMLType type);

}  // namespace ember
