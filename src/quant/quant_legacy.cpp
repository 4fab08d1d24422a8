// The 32-element block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1: scalar reference dequantize
// and quantize. Rounding follows ggml's reference quantizers (bit-exact with gguf.quants).
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/decode.h"
#include "quant/half.h"
#include "quant/kernels.h"

// Bit-exactness needs each multiply and add rounded separately (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {
namespace {

// Signed value with the largest magnitude (the first one on ties), as ggml picks it.
float signed_absmax(const float* x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    return max;
}

float inverse_or_zero(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

int clamp_trunc(float v, int hi) {
    const int q = int(v);   // v >= 0 here: truncation == floor
    return q < hi ? q : hi;
}

// Packs 32 quants (0..31) into 16 nibble bytes (element j low, j + 16 high) and the qh word.
void pack_q5(const uint8_t* q, uint8_t* qs, uint8_t* qh) {
    uint32_t h = 0;
    for (int j = 0; j < 16; ++j) {
        qs[j] = uint8_t((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    }
    for (int j = 0; j < 32; ++j) h |= uint32_t((q[j] >> 4) & 1) << j;
    std::memcpy(qh, &h, 4);
}

}  // namespace

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
    const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
    int q[32];
    for (int64_t i = 0; i < n / QK4_0; ++i, dst += QK4_0) {
        const float d = half_to_float(b[i].d);
        decode_q4(b[i].qs, 8, q);
        for (int j = 0; j < 32; ++j) dst[j] = d * float(q[j]);
    }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
    const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
    int q[32];
    for (int64_t i = 0; i < n / QK4_1; ++i, dst += QK4_1) {
        const float d = half_to_float(b[i].d), m = half_to_float(b[i].m);
        decode_q4(b[i].qs, 0, q);
        for (int j = 0; j < 32; ++j) dst[j] = d * float(q[j]) + m;
    }
}

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
    const BlockQ5_0* b = static_cast<const BlockQ5_0*>(src);
    int q[32];
    for (int64_t i = 0; i < n / QK5_0; ++i, dst += QK5_0) {
        const float d = half_to_float(b[i].d);
        decode_q5(b[i].qs, b[i].qh, 16, q);
        for (int j = 0; j < 32; ++j) dst[j] = d * float(q[j]);
    }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
    const BlockQ5_1* b = static_cast<const BlockQ5_1*>(src);
    int q[32];
    for (int64_t i = 0; i < n / QK5_1; ++i, dst += QK5_1) {
        const float d = half_to_float(b[i].d), m = half_to_float(b[i].m);
        decode_q5(b[i].qs, b[i].qh, 0, q);
        for (int j = 0; j < 32; ++j) dst[j] = d * float(q[j]) + m;
    }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n / QK8_0; ++i, dst += QK8_0) {
        const float d = half_to_float(b[i].d);
        for (int j = 0; j < 32; ++j) dst[j] = float(b[i].qs[j]) * d;
    }
}

void dequantize_row_q8_1(const void* src, float* dst, int64_t n) {
    const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
    for (int64_t i = 0; i < n / QK8_1; ++i, dst += QK8_1) {
        const float d = half_to_float(b[i].d);
        for (int j = 0; j < 32; ++j) dst[j] = float(b[i].qs[j]) * d;
    }
}

// Q4_0: d = -max/8 so the largest-magnitude value maps to q = 0; q = trunc(x/d + 8.5).
void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
    BlockQ4_0* b = static_cast<BlockQ4_0*>(dst);
    for (int64_t i = 0; i < n / QK4_0; ++i, src += QK4_0) {
        const float d = signed_absmax(src, QK4_0) / -8.0f;
        const float id = inverse_or_zero(d);
        b[i].d = float_to_half(d);
        for (int j = 0; j < 16; ++j) {
            const int q0 = clamp_trunc(src[j] * id + 8.5f, 15);
            const int q1 = clamp_trunc(src[j + 16] * id + 8.5f, 15);
            b[i].qs[j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

// Q4_1: d = (max - min)/15, m = min; q = trunc((x - min)/d + 0.5).
void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
    BlockQ4_1* b = static_cast<BlockQ4_1*>(dst);
    for (int64_t i = 0; i < n / QK4_1; ++i, src += QK4_1) {
        float mn = src[0], mx = src[0];
        for (int j = 1; j < QK4_1; ++j) {
            mn = src[j] < mn ? src[j] : mn;
            mx = src[j] > mx ? src[j] : mx;
        }
        const float d = (mx - mn) / 15.0f;
        const float id = inverse_or_zero(d);
        b[i].d = float_to_half(d);
        b[i].m = float_to_half(mn);
        for (int j = 0; j < 16; ++j) {
            const int q0 = clamp_trunc((src[j] - mn) * id + 0.5f, 15);
            const int q1 = clamp_trunc((src[j + 16] - mn) * id + 0.5f, 15);
            b[i].qs[j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
    BlockQ5_0* b = static_cast<BlockQ5_0*>(dst);
    uint8_t q[32];
    for (int64_t i = 0; i < n / QK5_0; ++i, src += QK5_0) {
        const float d = signed_absmax(src, QK5_0) / -16.0f;
        const float id = inverse_or_zero(d);
        b[i].d = float_to_half(d);
        for (int j = 0; j < 32; ++j) q[j] = uint8_t(clamp_trunc(src[j] * id + 16.5f, 31));
        pack_q5(q, b[i].qs, b[i].qh);
    }
}

void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
    BlockQ5_1* b = static_cast<BlockQ5_1*>(dst);
    uint8_t q[32];
    for (int64_t i = 0; i < n / QK5_1; ++i, src += QK5_1) {
        float mn = src[0], mx = src[0];
        for (int j = 1; j < QK5_1; ++j) {
            mn = src[j] < mn ? src[j] : mn;
            mx = src[j] > mx ? src[j] : mx;
        }
        const float d = (mx - mn) / 31.0f;
        const float id = inverse_or_zero(d);
        b[i].d = float_to_half(d);
        b[i].m = float_to_half(mn);
        for (int j = 0; j < 32; ++j) q[j] = uint8_t(clamp_trunc((src[j] - mn) * id + 0.5f, 31));
        pack_q5(q, b[i].qs, b[i].qh);
    }
}

// round-half-away(v) as int8 for |v| <= 127.5, and 0 where v is not finite (inf * 0 or NaN in a
// non-finite block, or a subnormal amax whose 1/d overflows): converting those to an integer is
// undefined; 0 is what x86's conversion left in the int8 before.
static inline int8_t round_q8(float v) { return std::isfinite(v) ? int8_t(std::roundf(v)) : int8_t(0); }

// Q8_0: d = amax/127, q = round-half-away(x/d) in [-127, 127].
uint16_t quantize_group_q8_0(const float* x, int8_t* q) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = inverse_or_zero(d);
    for (int j = 0; j < QK8_0; ++j) q[j] = round_q8(x[j] * id);
    return float_to_half(d);
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
    BlockQ8_0* b = static_cast<BlockQ8_0*>(dst);
    for (int64_t i = 0; i < n / QK8_0; ++i, src += QK8_0) b[i].d = quantize_group_q8_0(src, b[i].qs);
}

// Q8_1: as Q8_0 plus s = d * sum(q), which the *_1 dot products use for the min term.
void quantize_row_q8_1(const float* src, void* dst, int64_t n) {
    BlockQ8_1* b = static_cast<BlockQ8_1*>(dst);
    for (int64_t i = 0; i < n / QK8_1; ++i, src += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; ++j) amax = std::fmax(amax, std::fabs(src[j]));
        const float d = amax / 127.0f;
        const float id = inverse_or_zero(d);
        int sum = 0;   // of the stored int8 values, as llama.cpp and the SIMD kernels: at most 32 * 127
        for (int j = 0; j < QK8_1; ++j) {
            b[i].qs[j] = round_q8(src[j] * id);
            sum += b[i].qs[j];
        }
        b[i].d = float_to_half(d);
        b[i].s = float_to_half(float(sum) * d);
    }
}

}  // namespace ember
