// Dequantization of packed weights to f16 [n_out][n_in] for the prompt (tensor-core) path:
// each thread writes 8 consecutive elements of one row as one 16-byte store.
#include "block_decode.cuh"
#include "common.cuh"
#include "kernels.h"

namespace ember {
namespace cuda {

namespace {

struct DqParams {
    GGMLType type;
    const uint8_t* w;
    const uint8_t* meta;
    const uint8_t* meta2;
    int64_t n_in, n_out, n_blocks;
};

// The 8 elements starting at e (a multiple of 8) of a row, through the type's block decoder
// (block_decode.cuh): two words of quants, four elements each.
// out[k] = d * the k-th signed byte of v, k < 4: one grid point's four values, as the IQ types store them.
__device__ __forceinline__ void put_scaled_bytes(float* out, float d, uint32_t v) {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = d * float(sbyte(v, k));
}

template <GGMLType T>
__device__ __forceinline__ void dequant8(const DqParams& p, int64_t row, int64_t e, float* out) {
    using D = typename BlockDecoder<T>::type;
    if constexpr (kLowBitType<T>) {
        dequant8_low_bit<T>(p.w, p.meta, p.n_blocks, row, e, out);
    } else if constexpr (kQ2Q3Type<T>) {
        dequant8_q2_q3<T>(p.w, p.meta, p.n_blocks, row, e, out);
    } else if constexpr (T == GGMLType::Q4_0 || T == GGMLType::Q4_1 || T == GGMLType::Q5_0 || T == GGMLType::Q5_1 ||
                         T == GGMLType::Q8_0 || T == GGMLType::MXFP4 || T == GGMLType::IQ4_NL) {
        const int64_t b = row * p.n_blocks + e / 32;
        const int g = int(e % 32) / 4;   // groups g and g + 1, whose words are neighbours
        const uint2 q = *reinterpret_cast<const uint2*>(p.w + b * D::kQuantBytes + 4 * D::word(g));
        const typename D::Meta mt = reinterpret_cast<const typename D::Meta*>(p.meta)[b];
        const float d = D::d(mt), m = D::m(mt);
        const uint32_t qh = D::qh(mt), w[2] = {q.x, q.y};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t v = uint32_t(D::values(w[h], g + h, qh));
#pragma unroll
            for (int j = 0; j < 4; ++j) out[4 * h + j] = D::dequant(d, m, sbyte(v, j));
        }
    } else if constexpr (T == GGMLType::Q4_K || T == GGMLType::Q5_K) {
        const uint8_t* base = p.w + (row * p.n_blocks + e / 256) * D::kBlockBytes;
        const int i = int(e % 256), sub = i / 32, l = i % 32;
        const uint4 hdr = *reinterpret_cast<const uint4*>(base);
        float sc, mn;
        D::scale_min(hdr.y, hdr.z, hdr.w, sub, sc, mn);
        const float d = D::d(hdr.x) * sc, dm = D::dmin(hdr.x) * mn;
        const uint2 q = *reinterpret_cast<const uint2*>(base + D::kQsOffset + 32 * (sub / 2) + l);
        const uint2 qh = T == GGMLType::Q5_K ? *reinterpret_cast<const uint2*>(base + D::kQhOffset + l)
                                             : make_uint2(0u, 0u);
        const uint32_t qw[2] = {q.x, q.y}, hw[2] = {qh.x, qh.y};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t v = D::quants(qw[h], hw[h], sub);
#pragma unroll
            for (int j = 0; j < 4; ++j) out[4 * h + j] = d * float((v >> (8 * j)) & 0xFF) - dm;
        }
    } else if constexpr (T == GGMLType::IQ4_XS) {
        // sub-block j's groups g, g + 1 (g even): neighbouring words of its 16 nibble bytes
        const int64_t b = row * p.n_blocks + e / 256;
        const int i = int(e % 256), j = i / 32, g = (i % 32) / 4;
        const uint2 q = *reinterpret_cast<const uint2*>(p.w + b * D::kQuantBytes + 16 * j + 4 * (g & 3));
        const uint2 mt = reinterpret_cast<const uint2*>(p.meta)[b];
        const float d = D::d(mt) * float(D::scale(mt, j));
        const uint32_t w[2] = {q.x, q.y};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t v = uint32_t(D::values(w[h], g + h));
            put_scaled_bytes(out + 4 * h, d, v);
        }
    } else if constexpr (T == GGMLType::IQ3_S) {
        // points l, l + 1 (l even) of sub-block j
        const int64_t b = row * p.n_blocks + e / 256;
        const int i = int(e % 256), j = i / 32, l = (i % 32) / 4;
        const uint8_t* base = p.w + b * D::kQuantBytes;
        const uint4 tail = *reinterpret_cast<const uint4*>(base + D::kTail);
        const uint32_t signs = *reinterpret_cast<const uint32_t*>(base + D::kSigns + 4 * j), qh = D::qh(tail, j);
        const float d = D::d(reinterpret_cast<const uint16_t*>(p.meta)[b]) * float(D::scale(tail, j));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t v = uint32_t(D::values(base[8 * j + l + h], (qh >> (l + h)) & 1, signs >> (4 * (l + h))));
            put_scaled_bytes(out + 4 * h, d, v);
        }
    } else if constexpr (T == GGMLType::IQ3_XXS) {
        // points l, l + 1 (l even) of sub-block j
        const int64_t b = row * p.n_blocks + e / 256;
        const int i = int(e % 256), j = i / 32, l = (i % 32) / 4;
        const uint8_t* base = p.w + b * D::kQuantBytes;
        const uint32_t aux = *reinterpret_cast<const uint32_t*>(base + D::kAux + 4 * j), signs = D::signs(aux);
        const float d = D::d(reinterpret_cast<const uint16_t*>(p.meta)[b]) * float(D::scale(aux));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t v = uint32_t(D::values(base[8 * j + l + h], signs >> (4 * (l + h))));
            put_scaled_bytes(out + 4 * h, d, v);
        }
    } else if constexpr (T == GGMLType::IQ2_XXS) {
        // groups g, g + 1 (g even: one 8-value point) of sub-block j
        const int64_t b = row * p.n_blocks + e / 256;
        const int i = int(e % 256), j = i / 32, g = (i % 32) / 4;
        const uint2 q = *reinterpret_cast<const uint2*>(p.w + b * D::kQuantBytes + 8 * j);
        const uint32_t signs = DecodeIQ3_XXS::signs(q.y);
        const float d = D::d(reinterpret_cast<const uint16_t*>(p.meta)[b]) * float(DecodeIQ3_XXS::scale(q.y));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t v = uint32_t(D::values(q.x, signs, g + h));
            put_scaled_bytes(out + 4 * h, d, v);
        }
    } else if constexpr (T == GGMLType::IQ2_XS) {
        // groups g, g + 1 (g even: one 8-value point) of sub-block j
        const int64_t b = row * p.n_blocks + e / 256;
        const int i = int(e % 256), j = i / 32, g = (i % 32) / 4;
        const uint8_t* base = p.w + b * D::kQuantBytes;
        const uint2 q = *reinterpret_cast<const uint2*>(base + 8 * j);
        const float d = D::d(reinterpret_cast<const uint16_t*>(p.meta)[b]) *
                        float(D::scale(base[D::kScales + j], g / 4));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t v = uint32_t(D::values(q, g + h));
            put_scaled_bytes(out + 4 * h, d, v);
        }
    } else if constexpr (T == GGMLType::IQ2_S) {
        // groups g, g + 1 (g even: one 8-value point) of sub-block j
        const int64_t b = row * p.n_blocks + e / 256;
        const int i = int(e % 256), j = i / 32, g = (i % 32) / 4;
        const uint8_t* base = p.w + b * D::kQuantBytes;
        const uint32_t qs = *reinterpret_cast<const uint32_t*>(base + 4 * j);
        const uint32_t signs = *reinterpret_cast<const uint32_t*>(base + D::kSigns + 4 * j);
        const float d = D::d(reinterpret_cast<const uint16_t*>(p.meta)[b]) *
                        float(DecodeIQ2_XS::scale(base[D::kTail + 8 + j], g / 4));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t v = uint32_t(D::values(qs, base[D::kTail + j], signs, g + h));
            put_scaled_bytes(out + 4 * h, d, v);
        }
    } else if constexpr (T == GGMLType::Q6_K) {
        const int64_t b = row * p.n_blocks + e / 256;
        const int i = int(e % 256), h = i / 128, k = (i % 128) / 32, l = i % 32;
        const uint8_t* qs = p.w + b * D::kQuantBytes;
        const uint2 ql = *reinterpret_cast<const uint2*>(qs + h * D::kQlHalf + (k & 1) * D::kQlOdd + l);
        const uint2 qh = *reinterpret_cast<const uint2*>(qs + D::kQh + h * D::kQhHalf + l);
        const float d = h2f(reinterpret_cast<const uint16_t*>(p.meta2)[b]) *
                        float(reinterpret_cast<const int8_t*>(p.meta)[b * 16 + D::scale_index(h, k, l)]);
        const uint32_t lw[2] = {ql.x, ql.y}, hw[2] = {qh.x, qh.y};
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            const uint32_t v = uint32_t(D::values(lw[s], hw[s], k));
#pragma unroll
            for (int j = 0; j < 4; ++j) out[4 * s + j] = d * float(sbyte(v, j));
        }
    }
}

template <GGMLType T>
__global__ void dequantize_kernel(DqParams p, __half* __restrict__ out) {
    const int64_t per_row = p.n_in / 8, total = p.n_out * per_row;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = g / per_row, e = (g % per_row) * 8;
        float v[8];
        dequant8<T>(p, row, e, v);
        __align__(16) __half2 h[4];
        for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
        *reinterpret_cast<uint4*>(out + row * p.n_in + e) = *reinterpret_cast<const uint4*>(h);
    }
}

}  // namespace

void dequantize_f16(const DeviceWeight& w, __half* out, cudaStream_t s) {
    DqParams p{w.type, w.base,  w.base + w.layout.meta_off, w.base + w.layout.meta2_off,
               w.n_in, w.n_out, w.layout.n_blocks};
    const int64_t total = w.n_out * (w.n_in / 8);
    const unsigned grid = unsigned(std::min<int64_t>((total + 255) / 256, 132 * 32));
    switch (w.type) {
        case GGMLType::Q4_0: dequantize_kernel<GGMLType::Q4_0><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q4_1: dequantize_kernel<GGMLType::Q4_1><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q5_0: dequantize_kernel<GGMLType::Q5_0><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q5_1: dequantize_kernel<GGMLType::Q5_1><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q8_0: dequantize_kernel<GGMLType::Q8_0><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q2_K: dequantize_kernel<GGMLType::Q2_K><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q3_K: dequantize_kernel<GGMLType::Q3_K><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q4_K: dequantize_kernel<GGMLType::Q4_K><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q5_K: dequantize_kernel<GGMLType::Q5_K><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q6_K: dequantize_kernel<GGMLType::Q6_K><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::MXFP4: dequantize_kernel<GGMLType::MXFP4><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::IQ4_NL: dequantize_kernel<GGMLType::IQ4_NL><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::IQ4_XS: dequantize_kernel<GGMLType::IQ4_XS><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::IQ3_S: dequantize_kernel<GGMLType::IQ3_S><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::IQ3_XXS: dequantize_kernel<GGMLType::IQ3_XXS><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::IQ2_XXS: dequantize_kernel<GGMLType::IQ2_XXS><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::IQ2_XS: dequantize_kernel<GGMLType::IQ2_XS><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::IQ2_S: dequantize_kernel<GGMLType::IQ2_S><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::IQ1_S: dequantize_kernel<GGMLType::IQ1_S><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::IQ1_M: dequantize_kernel<GGMLType::IQ1_M><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::TQ1_0: dequantize_kernel<GGMLType::TQ1_0><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::TQ2_0: dequantize_kernel<GGMLType::TQ2_0><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::NVFP4: dequantize_kernel<GGMLType::NVFP4><<<grid, 256, 0, s>>>(p, out); break;
        default: fail("cuda dequantize: type ", block_info(w.type).name, " is not a quantized type");
    }
    EMBER_CUDA_LAUNCHED("dequantize_f16");
}

}  // namespace cuda
}  // namespace ember
