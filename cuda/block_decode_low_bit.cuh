// The CUDA block decoders of the ternary, 1-bit and NVFP4 types (TQ1_0, TQ2_0, IQ1_S, IQ1_M, NVFP4)
// over their packed layouts (weight_pack.cpp), and their 8-element dequantize for the cuBLAS path.
// Included at the end of block_decode.cuh; the GEMV formats are in gemv_formats_low_bit.cuh.
#pragma once
#include "block_decode.cuh"

namespace ember {
namespace cuda {

// Half an unsigned e4m3 scale (bit 7 ignored, 0x7f read as zero), as the CPU's ue4m3_half.
__device__ __forceinline__ float ue4m3_half(uint32_t x) {
    const uint32_t e = (x >> 3) & 15, m = x & 7;
    if (x == 0x7F || (e == 0 && m == 0)) return 0.f;
    return e ? __uint_as_float((e + 119) << 23 | m << 20) : float(m) * 0x1p-10f;
}

// ---- TQ1_0 / TQ2_0 ----
// Four bytes each times 3 (mod 256, byte by byte): the next base-3 digit moves to the top.
__device__ __forceinline__ uint32_t times3_4(uint32_t q) { return __vadd4(__vadd4(q, q), q); }
// The leading base-3 digit of four bytes as -1, 0, 1: -1 + [q > 85] + [q > 170].
__device__ __forceinline__ int ternary4(uint32_t q) {
    return int(__vsub4(__vsub4(0xFFFFFFFFu, __vcmpgtu4(q, 0x55555555u)), __vcmpgtu4(q, 0xAAAAAAAAu)));
}
// TQ2_0: the 2-bit codes at shift 2 s of four bytes, as -1, 0, 1.
__device__ __forceinline__ int tq2_values(uint32_t w, int s) {
    return int(__vsub4((w >> (2 * s)) & 0x03030303u, 0x01010101u));
}

// TQ1_0, packed: 64 quant bytes a block (qs[48] | qh[4] | 12 bytes of pad), f16 d in meta.
struct DecodeTQ1_0 {
    static constexpr GGMLType kType = GGMLType::TQ1_0;
    static constexpr int kQuantBytes = 64, kQh = 48;
};
// TQ2_0, packed: its 64 quant bytes as they are, f16 d in meta.
struct DecodeTQ2_0 {
    static constexpr GGMLType kType = GGMLType::TQ2_0;
    static constexpr int kQuantBytes = 64;
};

// ---- IQ1_S / IQ1_M: points of iq1s_grid (8 int8 values -1, 0, 1, two words a point) ----
static __device__ const Grid4096 kIq1sGrid = iq1s_grid;

// Four grid values v as 8 v + shift (shift: 0x01010101 or 0xffffffff, +1 or -1 a byte).
__device__ __forceinline__ int iq1_values(uint32_t word, uint32_t shift) {
    const uint32_t neg = (word >> 7) & 0x01010101u, pos = word & ~(word >> 7) & 0x01010101u;
    return int(__vadd4(__vsub4(pos << 3, neg << 3), shift));
}
__device__ __forceinline__ uint32_t iq1_shift(bool negative) { return negative ? 0xFFFFFFFFu : 0x01010101u; }
__device__ __forceinline__ int iq1_word(uint32_t point, int half, uint32_t shift) {
    return iq1_values(__ldg(&kIq1sGrid.v[2 * point + half]), shift);
}

// IQ1_S, packed: 48 quant bytes a block (qs[32] | qh[8] as u16), f16 d in meta. Sub-block j: qs word
// j (4 point indices' low bytes) and qh[j] (their bits 8-10, the scale, the shift's sign).
struct DecodeIQ1_S {
    static constexpr GGMLType kType = GGMLType::IQ1_S;
    static constexpr int kQuantBytes = 48, kQh = 32;
    // d / 8: values are 8 v + shift
    __device__ __forceinline__ static float d(uint16_t m) { return h2f(m) * 0.125f; }
    __device__ __forceinline__ static int scale(uint32_t qh) { return 2 * int((qh >> 12) & 7) + 1; }
    __device__ __forceinline__ static uint32_t point(uint32_t qs4, uint32_t qh, int l) {
        return ((qs4 >> (8 * l)) & 0xFF) | (((qh >> (3 * l)) & 7) << 8);
    }
};

// IQ1_M, packed: 64 quant bytes a block (qs[32] | qh[16] | scales[8] | 8 bytes of pad), no meta: d is
// in the scale words' top nibbles. Sub-block j: qs word j, qh bytes 2 j, 2 j + 1 (a nibble a point:
// bits 8-10 of its index, the shift's sign), its two scales in scale word j / 2.
struct DecodeIQ1_M {
    static constexpr GGMLType kType = GGMLType::IQ1_M;
    static constexpr int kQuantBytes = 64, kQh = 32, kScales = 48;
    // d / 8 from the scale words (x: words 0, 1; y: words 2, 3)
    __device__ __forceinline__ static float d(uint2 sc) {
        const uint32_t bits = ((sc.x >> 12) & 0xF) | ((sc.x >> 24) & 0xF0) | ((sc.y >> 4) & 0xF00) |
                              ((sc.y >> 16) & 0xF000);
        return h2f(uint16_t(bits)) * 0.125f;
    }
    // the scale 2 s + 1 of half h (16 values) of sub-block j
    __device__ __forceinline__ static int scale(uint2 sc, int j, int h) {
        const uint32_t word = ((j < 4 ? sc.x : sc.y) >> (16 * ((j >> 1) & 1))) & 0xFFFF;
        return 2 * int((word >> (6 * (j & 1) + 3 * h)) & 7) + 1;
    }
    // point l (0..3) of a sub-block from its qs word and its two qh bytes (qh2)
    __device__ __forceinline__ static uint32_t point(uint32_t qs4, uint32_t qh2, int l) {
        return ((qs4 >> (8 * l)) & 0xFF) | (((qh2 >> (4 * l)) & 7) << 8);
    }
    __device__ __forceinline__ static uint32_t shift(uint32_t qh2, int l) {
        return iq1_shift((qh2 >> (4 * l + 3)) & 1);
    }
};

// NVFP4, packed: 32 quant bytes a block of 64 (sub-block s of 16: bytes 8 s .. 8 s + 7, low nibbles
// values 0-7, high ones 8-15), the 4 e4m3 scale bytes as one u32 in meta. Group g (0..7) of half h (two
// sub-blocks, 32 values): the low (g % 4 < 2) or high nibbles of word (g / 4) * 2 + g % 2 of the half.
struct DecodeNVFP4 {
    static constexpr GGMLType kType = GGMLType::NVFP4;
    static constexpr int kQuantBytes = 32;
    __device__ __forceinline__ static int values(uint4 q, int g) {
        const uint32_t w = (g & 1) ? ((g & 4) ? q.w : q.y) : ((g & 4) ? q.z : q.x);
        const uint32_t nib = ((g & 2) ? w >> 4 : w) & 0x0F0F0F0Fu;
        return int(lookup16(nib, DecodeMXFP4::kT0, DecodeMXFP4::kT1, DecodeMXFP4::kT2, DecodeMXFP4::kT3));
    }
    __device__ __forceinline__ static float d(uint32_t meta, int s) { return ue4m3_half((meta >> (8 * s)) & 0xFF); }
};

template <>
struct BlockDecoder<GGMLType::TQ1_0> {
    using type = DecodeTQ1_0;
};
template <>
struct BlockDecoder<GGMLType::TQ2_0> {
    using type = DecodeTQ2_0;
};
template <>
struct BlockDecoder<GGMLType::IQ1_S> {
    using type = DecodeIQ1_S;
};
template <>
struct BlockDecoder<GGMLType::IQ1_M> {
    using type = DecodeIQ1_M;
};
template <>
struct BlockDecoder<GGMLType::NVFP4> {
    using type = DecodeNVFP4;
};

// out[k] = d * the k-th signed byte of v (k < 4).
__device__ __forceinline__ void put_scaled_bytes4(float* out, float d, uint32_t v) {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = d * float(sbyte(v, k));
}

template <GGMLType T>
constexpr bool kLowBitType = T == GGMLType::TQ1_0 || T == GGMLType::TQ2_0 || T == GGMLType::IQ1_S ||
                             T == GGMLType::IQ1_M || T == GGMLType::NVFP4;

// The 8 elements starting at e (a multiple of 8) of row `row`, in the CPU's order of rounding
// (quant_low_bit.cpp): (d * scale) * value.
template <GGMLType T>
__device__ __forceinline__ void dequant8_low_bit(const uint8_t* w, const uint8_t* meta, int64_t n_blocks, int64_t row,
                                                 int64_t e, float* out) {
    using D = typename BlockDecoder<T>::type;
    if constexpr (T == GGMLType::NVFP4) {
        const int64_t b = row * n_blocks + e / 64;
        const int i = int(e % 64), s = i / 16;
        const uint2 q = *reinterpret_cast<const uint2*>(w + b * D::kQuantBytes + 8 * s);
        const float d = D::d(reinterpret_cast<const uint32_t*>(meta)[b], s);
        const int shift = (i % 16) < 8 ? 0 : 4;
        const uint32_t lo = (q.x >> shift) & 0x0F0F0F0Fu, hi = (q.y >> shift) & 0x0F0F0F0Fu;
        put_scaled_bytes4(out, d, lookup16(lo, DecodeMXFP4::kT0, DecodeMXFP4::kT1, DecodeMXFP4::kT2, DecodeMXFP4::kT3));
        put_scaled_bytes4(out + 4, d,
                          lookup16(hi, DecodeMXFP4::kT0, DecodeMXFP4::kT1, DecodeMXFP4::kT2, DecodeMXFP4::kT3));
    } else {
        const int64_t b = row * n_blocks + e / 256;
        const int i = int(e % 256);
        const uint8_t* base = w + b * D::kQuantBytes;
        if constexpr (T == GGMLType::TQ2_0) {
            const int c = i / 128, s = (i % 128) / 32;
            const uint2 q = *reinterpret_cast<const uint2*>(base + 32 * c + i % 32);
            const float d = h2f(reinterpret_cast<const uint16_t*>(meta)[b]);
            put_scaled_bytes4(out, d, uint32_t(tq2_values(q.x, s)));
            put_scaled_bytes4(out + 4, d, uint32_t(tq2_values(q.y, s)));
        } else if constexpr (T == GGMLType::TQ1_0) {
            // values 32 k + m (k < 5) of qs[m], 160 + 16 k + m of qs[32 + m], 240 + 4 k + j of qh[j]
            int k, at;
            if (i < 160) k = i / 32, at = i % 32;
            else if (i < 240) k = (i - 160) / 16, at = 32 + (i - 160) % 16;
            else k = (i - 240) / 4, at = D::kQh;
            const float d = h2f(reinterpret_cast<const uint16_t*>(meta)[b]);
            uint2 q = *reinterpret_cast<const uint2*>(base + at);
            if (i >= 240) q.y = q.x;   // digits k, k + 1 of qh's 4 bytes
            for (int r = 0; r < k; ++r) q.x = times3_4(q.x), q.y = times3_4(q.y);
            if (i >= 240) q.y = times3_4(q.y);
            put_scaled_bytes4(out, d, uint32_t(ternary4(q.x)));
            put_scaled_bytes4(out + 4, d, uint32_t(ternary4(q.y)));
        } else if constexpr (T == GGMLType::IQ1_S) {
            const int j = i / 32, l = (i % 32) / 8;
            const uint32_t qs = base[4 * j + l], qh = reinterpret_cast<const uint16_t*>(base + D::kQh)[j];
            const uint32_t pt = qs | (((qh >> (3 * l)) & 7) << 8), sh = iq1_shift(qh & 0x8000);
            const float d = D::d(reinterpret_cast<const uint16_t*>(meta)[b]) * float(D::scale(qh));
            put_scaled_bytes4(out, d, uint32_t(iq1_word(pt, 0, sh)));
            put_scaled_bytes4(out + 4, d, uint32_t(iq1_word(pt, 1, sh)));
        } else if constexpr (T == GGMLType::IQ1_M) {
            const int j = i / 32, l = (i % 32) / 8;
            const uint2 sc = *reinterpret_cast<const uint2*>(base + D::kScales);
            const uint32_t qs4 = *reinterpret_cast<const uint32_t*>(base + 4 * j);
            const uint32_t qh2 = reinterpret_cast<const uint16_t*>(base + D::kQh)[j];
            const uint32_t pt = D::point(qs4, qh2, l), sh = D::shift(qh2, l);
            const float d = D::d(sc) * float(D::scale(sc, j, l / 2));
            put_scaled_bytes4(out, d, uint32_t(iq1_word(pt, 0, sh)));
            put_scaled_bytes4(out + 4, d, uint32_t(iq1_word(pt, 1, sh)));
        }
    }
}

}  // namespace cuda
}  // namespace ember
