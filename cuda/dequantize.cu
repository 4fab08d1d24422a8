// Dequantization of packed weights to f16 [n_out][n_in] for the prompt (tensor-core) path:
// each thread writes 8 consecutive elements of one row as one 16-byte store.
#include "common.cuh"
#include "gemv_formats.cuh"
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

// Value j (0..7) of the 8 elements starting at e (multiple of 8) of a row, for each format.
template <GGMLType T>
__device__ __forceinline__ void dequant8(const DqParams& p, int64_t row, int64_t e, float* out) {
    if constexpr (T == GGMLType::Q4_0 || T == GGMLType::Q4_1 || T == GGMLType::Q5_0 ||
                  T == GGMLType::Q5_1 || T == GGMLType::Q8_0) {
        const int64_t b = row * p.n_blocks + e / 32;
        const int i0 = int(e % 32);
        if constexpr (T == GGMLType::Q8_0) {
            const int8_t* q = reinterpret_cast<const int8_t*>(p.w + b * 32) + i0;
            const float d = h2f(reinterpret_cast<const uint16_t*>(p.meta)[b]);
            for (int j = 0; j < 8; ++j) out[j] = d * float(q[j]);
        } else {
            const uint8_t* q = p.w + b * 16 + (i0 & 15);
            const int shift = i0 >= 16 ? 4 : 0;
            float d, m = 0.f;
            uint32_t qh = 0;
            if constexpr (T == GGMLType::Q4_0) {
                d = h2f(reinterpret_cast<const uint16_t*>(p.meta)[b]);
            } else if constexpr (T == GGMLType::Q4_1) {
                const uint32_t dm = reinterpret_cast<const uint32_t*>(p.meta)[b];
                d = h2f(uint16_t(dm & 0xFFFF));
                m = h2f(uint16_t(dm >> 16));
            } else {
                const uint2 mt = reinterpret_cast<const uint2*>(p.meta)[b];
                d = h2f(uint16_t(mt.x & 0xFFFF));
                m = h2f(uint16_t(mt.x >> 16));
                qh = mt.y;
            }
            for (int j = 0; j < 8; ++j) {
                int v = (q[j] >> shift) & 0xF;
                if constexpr (T == GGMLType::Q4_0) {
                    out[j] = d * float(v - 8);
                } else if constexpr (T == GGMLType::Q4_1) {
                    out[j] = d * float(v) + m;
                } else {
                    v |= int((qh >> (i0 + j)) & 1) << 4;
                    out[j] = T == GGMLType::Q5_0 ? d * float(v - 16) : d * float(v) + m;
                }
            }
        }
    } else if constexpr (T == GGMLType::Q4_K || T == GGMLType::Q5_K) {
        constexpr int kBB = T == GGMLType::Q5_K ? 176 : 144;
        const uint8_t* base = p.w + (row * p.n_blocks + e / 256) * kBB;
        const int i = int(e % 256), jp = i / 64, within = i % 64, sub = 2 * jp + (within >= 32 ? 1 : 0);
        const uint32_t* hdr = reinterpret_cast<const uint32_t*>(base);
        const uint32_t dd = hdr[0];
        float sc, mn;
        kq_scale_min(hdr[1], hdr[2], hdr[3], sub, sc, mn);
        const float d = h2f(uint16_t(dd & 0xFFFF)) * sc, dm = h2f(uint16_t(dd >> 16)) * mn;
        const uint8_t* qs = base + (T == GGMLType::Q5_K ? 48 : 16) + 32 * jp + (within % 32);
        const int shift = within >= 32 ? 4 : 0;
        for (int j = 0; j < 8; ++j) {
            int v = (qs[j] >> shift) & 0xF;
            if constexpr (T == GGMLType::Q5_K) v |= ((base[16 + (within % 32) + j] >> sub) & 1) << 4;
            out[j] = d * float(v) - dm;
        }
    } else if constexpr (T == GGMLType::Q6_K) {
        const int64_t b = row * p.n_blocks + e / 256;
        const int i = int(e % 256), h = i / 128, r = i % 128, k = r / 32, l = r % 32;
        const uint8_t* ql = p.w + b * 192 + h * 64 + l + (k & 1) * 32;
        const uint8_t* qh = p.w + b * 192 + 128 + h * 32 + l;
        const int shift = k >= 2 ? 4 : 0;
        const float d = h2f(reinterpret_cast<const uint16_t*>(p.meta2)[b]) *
                        float(reinterpret_cast<const int8_t*>(p.meta)[b * 16 + h * 8 + l / 16 + 2 * k]);
        for (int j = 0; j < 8; ++j) {
            const int v = (((ql[j] >> shift) & 0xF) | (((qh[j] >> (2 * k)) & 3) << 4)) - 32;
            out[j] = d * float(v);
        }
    }
}

template <GGMLType T>
__global__ void dequantize_kernel(DqParams p, __half* __restrict__ out) {
    const int64_t per_row = p.n_in / 8, total = p.n_out * per_row;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total;
         g += int64_t(gridDim.x) * blockDim.x) {
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
    DqParams p{w.type, w.base, w.base + w.layout.meta_off, w.base + w.layout.meta2_off,
               w.n_in, w.n_out, w.layout.n_blocks};
    const int64_t total = w.n_out * (w.n_in / 8);
    const unsigned grid = unsigned(std::min<int64_t>((total + 255) / 256, 132 * 32));
    switch (w.type) {
        case GGMLType::Q4_0: dequantize_kernel<GGMLType::Q4_0><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q4_1: dequantize_kernel<GGMLType::Q4_1><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q5_0: dequantize_kernel<GGMLType::Q5_0><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q5_1: dequantize_kernel<GGMLType::Q5_1><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q8_0: dequantize_kernel<GGMLType::Q8_0><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q4_K: dequantize_kernel<GGMLType::Q4_K><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q5_K: dequantize_kernel<GGMLType::Q5_K><<<grid, 256, 0, s>>>(p, out); break;
        case GGMLType::Q6_K: dequantize_kernel<GGMLType::Q6_K><<<grid, 256, 0, s>>>(p, out); break;
        default: fail("cuda dequantize: type ", block_info(w.type).name, " is not a quantized type");
    }
    EMBER_CUDA_LAUNCHED("dequantize_f16");
}

}  // namespace cuda
}  // namespace ember
