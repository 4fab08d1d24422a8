// The CUDA block decoders of Q2_K and Q3_K over their packed layouts (weight_pack.cpp), and their
// 8-element dequantize for the cuBLAS path. Included at the end of block_decode.cuh; the GEMV
// formats are in gemv_formats_q2_q3.cuh.
#pragma once
#include "block_decode.cuh"

namespace ember {
namespace cuda {

// Both types: element 128h + 32k + l is bits 2k, 2k + 1 of qs byte 32h + l; its 16-element group
// (scale) is 8h + 2k + l / 16. The 2-bit codes of four bytes at shift 2k, one a byte:
__device__ __forceinline__ uint32_t q2_codes(uint32_t w, int k) { return (w >> (2 * k)) & 0x03030303u; }

// Q2_K, packed: its 80 quant bytes as they are (scales[16] | qs[64]), f16 d | f16 dmin << 16 in meta.
// Scale byte g: the scale in its low nibble, the min in its high one.
struct DecodeQ2_K {
    static constexpr GGMLType kType = GGMLType::Q2_K;
    static constexpr int kQuantBytes = 80, kQs = 16;
    __device__ __forceinline__ static float d(uint32_t m) { return h2f(uint16_t(m)); }
    __device__ __forceinline__ static float dmin(uint32_t m) { return h2f(uint16_t(m >> 16)); }
};

// Q3_K, packed: hmask[32] | qs[64] | scales[12] | 4 bytes of pad, f16 d in meta. The value is the
// code minus 4 where bit 4h + k of hmask byte l is clear.
struct DecodeQ3_K {
    static constexpr GGMLType kType = GGMLType::Q3_K;
    static constexpr int kQuantBytes = 112, kQs = 32, kScales = 96;
    // values of four elements: codes of qs word w at shift 2k, minus 4 where hmask word h lacks bit j
    __device__ __forceinline__ static int values(uint32_t w, uint32_t h, int k, int j) {
        const uint32_t clear = ~(h >> j) & 0x01010101u;
        return int(__vsub4(q2_codes(w, k), clear << 2));
    }
    // the signed scale of group g from the 12 packed bytes (three words): low 4 bits in nibble g / 8
    // of byte g % 8, high 2 bits at bit 2 (g / 4) of byte 8 + g % 4
    __device__ __forceinline__ static int scale(uint32_t s0, uint32_t s1, uint32_t s2, int g) {
        const uint32_t lo = (byte_of(s0, s1, 0, 0, g & 7) >> (4 * (g >> 3))) & 0x0F;
        const uint32_t hi = (byte_of(0, 0, s2, 0, 8 + (g & 3)) >> (2 * (g >> 2))) & 3;
        return int(lo | (hi << 4)) - 32;
    }
};

// clang-format off: one row a type
template <> struct BlockDecoder<GGMLType::Q2_K> { using type = DecodeQ2_K; };
template <> struct BlockDecoder<GGMLType::Q3_K> { using type = DecodeQ3_K; };
// clang-format on

template <GGMLType T>
constexpr bool kQ2Q3Type = T == GGMLType::Q2_K || T == GGMLType::Q3_K;

// The 8 elements starting at e (a multiple of 8) of row `row`, in the CPU's order of rounding
// (quant_kquants.cpp): (d * sc) * q, minus dmin * mn for Q2_K.
template <GGMLType T>
__device__ __forceinline__ void dequant8_q2_q3(const uint8_t* w, const uint8_t* meta, int64_t n_blocks, int64_t row,
                                               int64_t e, float* out) {
    using D = typename BlockDecoder<T>::type;
    const int64_t b = row * n_blocks + e / 256;
    const int i = int(e % 256), h = i / 128, k = (i % 128) / 32, l = i % 32, g = i / 16;
    const uint8_t* base = w + b * D::kQuantBytes;
    const uint2 q = *reinterpret_cast<const uint2*>(base + D::kQs + 32 * h + l);
    const uint32_t qw[2] = {q.x, q.y};
    if constexpr (T == GGMLType::Q2_K) {
        const uint32_t m = reinterpret_cast<const uint32_t*>(meta)[b], sc = base[g];
        const float dl = D::d(m) * float(sc & 0x0F), ml = D::dmin(m) * float(sc >> 4);
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const uint32_t v = q2_codes(qw[x], k);
#pragma unroll
            for (int j = 0; j < 4; ++j) out[4 * x + j] = dl * float((v >> (8 * j)) & 0xFF) - ml;
        }
    } else {
        const uint2 hm = *reinterpret_cast<const uint2*>(base + l);
        const uint4 s = *reinterpret_cast<const uint4*>(base + D::kScales);
        const float dl = h2f(reinterpret_cast<const uint16_t*>(meta)[b]) * float(D::scale(s.x, s.y, s.z, g));
        const uint32_t hw[2] = {hm.x, hm.y};
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const uint32_t v = uint32_t(D::values(qw[x], hw[x], k, 4 * h + k));
#pragma unroll
            for (int j = 0; j < 4; ++j) out[4 * x + j] = dl * float(sbyte(v, j));
        }
    }
}

}  // namespace cuda
}  // namespace ember
