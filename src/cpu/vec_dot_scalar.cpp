// Scalar reference dot products, weights x activations in the weight type's vec_dot_type:
// Q4_0/Q5_0/Q8_0/MXFP4/NVFP4/IQ4_NL x Q8_0, Q4_1/Q5_1/Q8_1 x Q8_1, Q2_K..Q6_K/Q8_K and the IQ and TQ
// super-block types (IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0) x Q8_K,
// F32/F16/BF16 x F32.
// Integer sums are exact per block; one float multiply-add per block, as ggml does.

#include "cpu/isa_kernels.h"
#include "quant/blocks.h"
#include "quant/decode.h"
#include "quant/half.h"

namespace ember {
namespace {

float dot_f32(int64_t n, const void* w, const void* x) {
    const float* a = static_cast<const float*>(w);
    const float* b = static_cast<const float*>(x);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
    return float(s);
}

float dot_f16(int64_t n, const void* w, const void* x) {
    const uint16_t* a = static_cast<const uint16_t*>(w);
    const float* b = static_cast<const float*>(x);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(half_to_float(a[i])) * b[i];
    return float(s);
}

float dot_bf16(int64_t n, const void* w, const void* x) {
    const uint16_t* a = static_cast<const uint16_t*>(w);
    const float* b = static_cast<const float*>(x);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(bf16_to_float(a[i])) * b[i];
    return float(s);
}

int dot32(const int* q, const int8_t* x) {
    int s = 0;
    for (int j = 0; j < 32; ++j) s += q[j] * x[j];
    return s;
}

float dot_q4_0(int64_t n, const void* w, const void* x) {
    const BlockQ4_0* a = static_cast<const BlockQ4_0*>(w);
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
    float s = 0;
    int q[32];
    for (int64_t i = 0; i < n / QK4_0; ++i) {
        decode_q4(a[i].qs, 8, q);
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(dot32(q, b[i].qs));
    }
    return s;
}

float dot_q4_1(int64_t n, const void* w, const void* x) {
    const BlockQ4_1* a = static_cast<const BlockQ4_1*>(w);
    const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
    float s = 0;
    int q[32];
    for (int64_t i = 0; i < n / QK4_1; ++i) {
        decode_q4(a[i].qs, 0, q);
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(dot32(q, b[i].qs)) +
             half_to_float(a[i].m) * half_to_float(b[i].s);
    }
    return s;
}

float dot_q5_0(int64_t n, const void* w, const void* x) {
    const BlockQ5_0* a = static_cast<const BlockQ5_0*>(w);
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
    float s = 0;
    int q[32];
    for (int64_t i = 0; i < n / QK5_0; ++i) {
        decode_q5(a[i].qs, a[i].qh, 16, q);
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(dot32(q, b[i].qs));
    }
    return s;
}

float dot_q5_1(int64_t n, const void* w, const void* x) {
    const BlockQ5_1* a = static_cast<const BlockQ5_1*>(w);
    const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
    float s = 0;
    int q[32];
    for (int64_t i = 0; i < n / QK5_1; ++i) {
        decode_q5(a[i].qs, a[i].qh, 0, q);
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(dot32(q, b[i].qs)) +
             half_to_float(a[i].m) * half_to_float(b[i].s);
    }
    return s;
}

float dot_q8_0(int64_t n, const void* w, const void* x) {
    const BlockQ8_0* a = static_cast<const BlockQ8_0*>(w);
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
    float s = 0;
    for (int64_t i = 0; i < n / QK8_0; ++i) {
        int si = 0;
        for (int j = 0; j < 32; ++j) si += a[i].qs[j] * b[i].qs[j];
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(si);
    }
    return s;
}

float dot_q8_1(int64_t n, const void* w, const void* x) {
    const BlockQ8_1* a = static_cast<const BlockQ8_1*>(w);
    const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
    float s = 0;
    for (int64_t i = 0; i < n / QK8_1; ++i) {
        int si = 0;
        for (int j = 0; j < 32; ++j) si += a[i].qs[j] * b[i].qs[j];
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(si);
    }
    return s;
}

// MXFP4 / IQ4_NL x Q8_0: the table values as integers (MXFP4's doubled, its scale halved).
float dot_mxfp4(int64_t n, const void* w, const void* x) {
    const BlockMXFP4* a = static_cast<const BlockMXFP4*>(w);
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
    float s = 0;
    int q[32];
    for (int64_t i = 0; i < n / QK4_0; ++i) {
        decode_table4(a[i].qs, kvalues_mxfp4, q);
        s += e8m0_half(a[i].e) * half_to_float(b[i].d) * float(dot32(q, b[i].qs));
    }
    return s;
}

float dot_iq4_nl(int64_t n, const void* w, const void* x) {
    const BlockIQ4_NL* a = static_cast<const BlockIQ4_NL*>(w);
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
    float s = 0;
    int q[32];
    for (int64_t i = 0; i < n / QK4_0; ++i) {
        decode_table4(a[i].qs, kvalues_iq4nl, q);
        s += half_to_float(a[i].d) * half_to_float(b[i].d) * float(dot32(q, b[i].qs));
    }
    return s;
}

// NVFP4 x Q8_0: each sub-block of 16 (half a Q8_0 block) with its own scale, as ggml sums it.
float dot_nvfp4(int64_t n, const void* w, const void* x) {
    const BlockNVFP4* a = static_cast<const BlockNVFP4*>(w);
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
    float s = 0;
    int q[16];
    for (int64_t i = 0; i < n / QK_NVFP4; ++i) {
        for (int sb = 0; sb < 4; ++sb) {
            const BlockQ8_0& xb = b[2 * i + sb / 2];
            decode_nvfp4_sub(a[i], sb, q);
            int si = 0;
            for (int j = 0; j < 16; ++j) si += q[j] * xb.qs[16 * (sb % 2) + j];
            s += half_to_float(xb.d) * ue4m3_half(a[i].d[sb]) * float(si);
        }
    }
    return s;
}

// K-quants: x.d * (d * sum sc*q*x - dmin * sum mn*bsum) over the decoded super-block
// (quant/decode.h).
float dot_k_decoded(const KDecoded& k, const BlockQ8_K& b) {
    int sumi = 0, summ = 0;
    for (int g = 0; g < 16; ++g) {
        int s = 0;
        for (int l = 0; l < 16; ++l) s += k.q[16 * g + l] * b.qs[16 * g + l];
        sumi += k.sc[g] * s;
        summ += k.mn[g] * b.bsums[g];
    }
    return b.d * (k.d * float(sumi) - k.dmin * float(summ));
}

template <class Block, void (*Decode)(const Block&, KDecoded&)>
float dot_k(int64_t n, const void* w, const void* x) {
    const Block* a = static_cast<const Block*>(w);
    const BlockQ8_K* b = static_cast<const BlockQ8_K*>(x);
    KDecoded k;
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        Decode(a[i], k);
        s += dot_k_decoded(k, b[i]);
    }
    return s;
}

float dot_q8_k(int64_t n, const void* w, const void* x) {
    const BlockQ8_K* a = static_cast<const BlockQ8_K*>(w);
    const BlockQ8_K* b = static_cast<const BlockQ8_K*>(x);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int si = 0;
        for (int e = 0; e < QK_K; ++e) si += a[i].qs[e] * b[i].qs[e];
        s += a[i].d * b[i].d * float(si);
    }
    return s;
}

}  // namespace

VecDotFn vec_dot_scalar(GGMLType type) {
    switch (type) {
        case GGMLType::F32: return dot_f32;
        case GGMLType::F16: return dot_f16;
        case GGMLType::BF16: return dot_bf16;
        case GGMLType::Q4_0: return dot_q4_0;
        case GGMLType::Q4_1: return dot_q4_1;
        case GGMLType::Q5_0: return dot_q5_0;
        case GGMLType::Q5_1: return dot_q5_1;
        case GGMLType::Q8_0: return dot_q8_0;
        case GGMLType::Q8_1: return dot_q8_1;
        case GGMLType::Q2_K: return dot_k<BlockQ2_K, decode_q2_k>;
        case GGMLType::Q3_K: return dot_k<BlockQ3_K, decode_q3_k>;
        case GGMLType::Q4_K: return dot_k<BlockQ4_K, decode_q4_k>;
        case GGMLType::Q5_K: return dot_k<BlockQ5_K, decode_q5_k>;
        case GGMLType::Q6_K: return dot_k<BlockQ6_K, decode_q6_k>;
        case GGMLType::Q8_K: return dot_q8_k;
        case GGMLType::MXFP4: return dot_mxfp4;
        case GGMLType::IQ4_NL: return dot_iq4_nl;
        case GGMLType::IQ4_XS: return dot_k<BlockIQ4_XS, decode_iq4_xs>;
        case GGMLType::IQ3_S: return dot_k<BlockIQ3_S, decode_iq3_s>;
        case GGMLType::IQ3_XXS: return dot_k<BlockIQ3_XXS, decode_iq3_xxs>;
        case GGMLType::IQ2_XXS: return dot_k<BlockIQ2_XXS, decode_iq2_xxs>;
        case GGMLType::IQ2_XS: return dot_k<BlockIQ2_XS, decode_iq2_xs>;
        case GGMLType::IQ2_S: return dot_k<BlockIQ2_S, decode_iq2_s>;
        case GGMLType::IQ1_S: return dot_k<BlockIQ1_S, decode_iq1_s>;
        case GGMLType::IQ1_M: return dot_k<BlockIQ1_M, decode_iq1_m>;
        case GGMLType::TQ1_0: return dot_k<BlockTQ1_0, decode_tq1_0>;
        case GGMLType::TQ2_0: return dot_k<BlockTQ2_0, decode_tq2_0>;
        case GGMLType::NVFP4: return dot_nvfp4;
    }
    return nullptr;
}

}  // namespace ember
