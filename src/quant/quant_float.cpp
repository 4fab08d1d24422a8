// Float element types (F32, F16, BF16): row conversions and the public fp16/bf16 helpers.
#include <cstring>

#include "quant/half.h"
#include "quant/kernels.h"

namespace ember {

float fp16_to_fp32(uint16_t h) { return half_to_float(h); }
uint16_t fp32_to_fp16(float f) { return float_to_half(f); }
float bf16_to_fp32(uint16_t h) { return bf16_to_float(h); }
uint16_t fp32_to_bf16(float f) { return float_to_bf16(f); }

void dequantize_row_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * sizeof(float)); }

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(s[i]);
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
}

void quantize_row_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * sizeof(float)); }

void quantize_row_f16(const float* src, void* dst, int64_t n) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_half(src[i]);
}

void quantize_row_bf16(const float* src, void* dst, int64_t n) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
}

}  // namespace ember
