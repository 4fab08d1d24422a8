// Private declarations of the per-type scalar row functions of each block format (the reference
// every backend's kernels match); traits.cpp wires them into the traits table.
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
void dequantize_row_mxfp4(const void* src, float* dst, int64_t n);
void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n);
void dequantize_row_iq3_s(const void* src, float* dst, int64_t n);
void dequantize_row_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_row_iq2_xxs(const void* src, float* dst, int64_t n);
void dequantize_row_iq2_xs(const void* src, float* dst, int64_t n);
void dequantize_row_iq2_s(const void* src, float* dst, int64_t n);
void dequantize_row_iq1_s(const void* src, float* dst, int64_t n);
void dequantize_row_iq1_m(const void* src, float* dst, int64_t n);
void dequantize_row_tq1_0(const void* src, float* dst, int64_t n);
void dequantize_row_tq2_0(const void* src, float* dst, int64_t n);
void dequantize_row_nvfp4(const void* src, float* dst, int64_t n);

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
void quantize_row_q2_k(const float* src, void* dst, int64_t n);
void quantize_row_q3_k(const float* src, void* dst, int64_t n);
void quantize_row_q4_k(const float* src, void* dst, int64_t n);
void quantize_row_q5_k(const float* src, void* dst, int64_t n);
void quantize_row_q6_k(const float* src, void* dst, int64_t n);
void quantize_row_q8_k(const float* src, void* dst, int64_t n);
void quantize_row_mxfp4(const float* src, void* dst, int64_t n);
void quantize_row_tq1_0(const float* src, void* dst, int64_t n);
void quantize_row_iq4_nl(const float* src, void* dst, int64_t n);
void quantize_row_iq4_xs(const float* src, void* dst, int64_t n);
// IQ4_NL with IQ4_XS's scale search (llama-quantize's for weights; the traits row has the KV cache's).
void quantize_row_iq4_nl_search(const float* src, void* dst, int64_t n);
void quantize_row_tq2_0(const float* src, void* dst, int64_t n);
// One Q8_0 group of 32 values into q; returns the scale d as f16 bits. Shared by
// quantize_row_q8_0 and the q8_0 KV cache, whose scales are stored apart from the int8 values.
uint16_t quantize_group_q8_0(const float* x, int8_t* q);

}  // namespace ember
