// The ternary, 1-bit and NVFP4 types (TQ1_0, TQ2_0, IQ1_S, IQ1_M, NVFP4): scalar reference dequantize,
// bit-exact with gguf.quants, and the ternary types' quantizers (ggml's: d = the block's largest
// magnitude, each value rounded to -1, 0 or 1).
#include <cmath>

#include "quant/decode.h"
#include "quant/kernels.h"

// gguf.quants rounds every product separately (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {
namespace {

// (d * sc) * q in gguf.quants' order of rounding: the IQ1 types' d / 8 and q = 8 value + shift scale
// both factors by an exact power of two.
template <class Block, void (*Decode)(const Block&, KDecoded&)>
void dequantize_k_form(const void* src, float* dst, int64_t n) {
    const Block* b = static_cast<const Block*>(src);
    KDecoded k;
    for (int64_t i = 0; i < n / QK_K; ++i, dst += QK_K) {
        Decode(b[i], k);
        for (int e = 0; e < QK_K; ++e) dst[e] = k.d * float(k.sc[e / 16]) * float(k.q[e]);
    }
}

// The block's d (its largest magnitude) and each value's code 0, 1, 2 (value + 1), rounded half away
// from zero as gguf.quants' np_roundf.
float ternary_codes(const float* x, uint8_t* code) {
    float amax = 0.0f;
    for (int j = 0; j < QK_K; ++j) amax = std::fabs(x[j]) > amax ? std::fabs(x[j]) : amax;
    const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
    for (int j = 0; j < QK_K; ++j) code[j] = uint8_t(int(std::round(x[j] * id)) + 1);
    return amax;
}

}  // namespace

void dequantize_row_tq1_0(const void* src, float* dst, int64_t n) {
    dequantize_k_form<BlockTQ1_0, decode_tq1_0>(src, dst, n);
}
void dequantize_row_tq2_0(const void* src, float* dst, int64_t n) {
    dequantize_k_form<BlockTQ2_0, decode_tq2_0>(src, dst, n);
}
void dequantize_row_iq1_s(const void* src, float* dst, int64_t n) {
    dequantize_k_form<BlockIQ1_S, decode_iq1_s>(src, dst, n);
}
void dequantize_row_iq1_m(const void* src, float* dst, int64_t n) {
    dequantize_k_form<BlockIQ1_M, decode_iq1_m>(src, dst, n);
}

void dequantize_row_nvfp4(const void* src, float* dst, int64_t n) {
    const BlockNVFP4* b = static_cast<const BlockNVFP4*>(src);
    int q[16];
    for (int64_t i = 0; i < n / QK_NVFP4; ++i) {
        for (int s = 0; s < 4; ++s, dst += 16) {
            const float d = ue4m3_half(b[i].d[s]);
            decode_nvfp4_sub(b[i], s, q);
            for (int j = 0; j < 16; ++j) dst[j] = d * float(q[j]);
        }
    }
}

// Five codes a byte, the first the most significant base-3 digit, stored as ceil(256 * v / 243).
void quantize_row_tq1_0(const float* src, void* dst, int64_t n) {
    BlockTQ1_0* b = static_cast<BlockTQ1_0*>(dst);
    uint8_t code[QK_K];
    auto pack = [](const uint8_t* c, int stride, int digits) {
        int v = 0;
        for (int k = 0; k < digits; ++k) v = 3 * v + c[stride * k];
        for (int k = digits; k < 5; ++k) v *= 3;
        return uint8_t((v * 256 + 242) / 243);
    };
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        b[i].d = float_to_half(ternary_codes(src, code));
        for (int m = 0; m < 32; ++m) b[i].qs[m] = pack(code + m, 32, 5);
        for (int m = 0; m < 16; ++m) b[i].qs[32 + m] = pack(code + 160 + m, 16, 5);
        for (int j = 0; j < 4; ++j) b[i].qh[j] = pack(code + 240 + j, 4, 4);
    }
}

void quantize_row_tq2_0(const float* src, void* dst, int64_t n) {
    BlockTQ2_0* b = static_cast<BlockTQ2_0*>(dst);
    uint8_t code[QK_K];
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        b[i].d = float_to_half(ternary_codes(src, code));
        for (int c = 0; c < 2; ++c)
            for (int m = 0; m < 32; ++m) {
                const uint8_t* v = code + 128 * c + m;
                b[i].qs[32 * c + m] = uint8_t(v[0] | v[32] << 2 | v[64] << 4 | v[96] << 6);
            }
    }
}

}  // namespace ember
