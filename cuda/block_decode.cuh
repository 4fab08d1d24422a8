// The CUDA backend's block decoders: one per tensor type, over its device layout (weight_pack.h).
// Each says where a block's scales, mins and quants lie and how 32-bit words of them unpack to
// four quants at a time; the GEMV, the GEMMs and dequantize read every type through these.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "ember/quant.h"
#include "quant/quant_tables.h"

namespace ember {
namespace cuda {

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Byte i (runtime, 0..15) of four words.
__device__ __forceinline__ uint32_t byte_of(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int i) {
    const uint32_t w = i < 8 ? (i < 4 ? w0 : w1) : (i < 12 ? w2 : w3);
    return (w >> (8 * (i & 3))) & 0xFF;
}

// Byte j (0..3) of a word of four signed quants, as an int.
__device__ __forceinline__ int sbyte(uint32_t w, int j) { return int(int8_t(uint8_t(w >> (8 * j)))); }

// ---- The 32-element block types, packed: kQuantBytes of quants a block in the quants region, one
// Meta a block in the meta region. Group g (0..7) of a block is its elements 4g..4g+3: the four
// bytes of quants word word(g) (nibble types: byte j holds element j low and j + 16 high, so the
// low nibbles of word g for g < 4 and the high nibbles of word g - 4 after; Q8_0: word g).
// quants(): group g's stored quants, one a byte (nibble types 0..15, Q5 0..31 with qh's bit 4);
// values(): the same minus the type's offset (signed bytes), so that a block's integer dot
// needs no offset term; dequant(): one element's value from its values() byte and d, m.

// The low (g < 4) or high nibbles of a quants word, one a byte.
__device__ __forceinline__ uint32_t nibbles_of(uint32_t w, int g) { return (g < 4 ? w : w >> 4) & 0x0F0F0F0Fu; }

struct DecodeQ4_0 {
    static constexpr GGMLType kType = GGMLType::Q4_0;
    static constexpr int kQuantBytes = 16;
    static constexpr bool kHasMin = false, kHighBits = false;
    using Meta = uint16_t;   // f16 d
    __device__ __forceinline__ static float d(Meta m) { return h2f(m); }
    __device__ __forceinline__ static float m(Meta) { return 0.f; }
    __device__ __forceinline__ static uint32_t qh(Meta) { return 0u; }
    __host__ __device__ static constexpr int word(int g) { return g & 3; }
    __device__ __forceinline__ static uint32_t quants(uint32_t w, int g, uint32_t) { return nibbles_of(w, g); }
    // q - 8: the integer dot is exact, as in ggml's q4_0 x q8_0
    __device__ __forceinline__ static int values(uint32_t w, int g, uint32_t qh) {
        return int(__vsub4(quants(w, g, qh), 0x08080808u));
    }
    __device__ __forceinline__ static float dequant(float d, float, int v) { return d * float(v); }
};

struct DecodeQ4_1 {
    static constexpr GGMLType kType = GGMLType::Q4_1;
    static constexpr int kQuantBytes = 16;
    static constexpr bool kHasMin = true, kHighBits = false;
    using Meta = uint32_t;   // f16 d | f16 m << 16
    __device__ __forceinline__ static float d(Meta m) { return h2f(uint16_t(m & 0xFFFF)); }
    __device__ __forceinline__ static float m(Meta m) { return h2f(uint16_t(m >> 16)); }
    __device__ __forceinline__ static uint32_t qh(Meta) { return 0u; }
    __host__ __device__ static constexpr int word(int g) { return g & 3; }
    __device__ __forceinline__ static uint32_t quants(uint32_t w, int g, uint32_t) { return nibbles_of(w, g); }
    __device__ __forceinline__ static int values(uint32_t w, int g, uint32_t qh) { return int(quants(w, g, qh)); }
    __device__ __forceinline__ static float dequant(float d, float m, int v) { return d * float(v) + m; }
};

// Q5_0 (kMin false) and Q5_1: the Q4 nibbles plus bit 4 of element j from bit j of qh.
template <bool kMin>
struct DecodeQ5 {
    static constexpr GGMLType kType = kMin ? GGMLType::Q5_1 : GGMLType::Q5_0;
    static constexpr int kQuantBytes = 16;
    static constexpr bool kHasMin = kMin, kHighBits = true;
    using Meta = uint2;   // MetaQ5_0 / MetaQ5_1: {f16 d | (f16 m or pad) << 16, qh}
    __device__ __forceinline__ static float d(Meta m) { return h2f(uint16_t(m.x & 0xFFFF)); }
    __device__ __forceinline__ static float m(Meta m) { return h2f(uint16_t(m.x >> 16)); }
    __device__ __forceinline__ static uint32_t qh(Meta m) { return m.y; }
    __host__ __device__ static constexpr int word(int g) { return g & 3; }
    __device__ __forceinline__ static uint32_t quants(uint32_t w, int g, uint32_t qh) {
        return nibbles_of(w, g) | uint32_t(spread4_bit4(qh >> (4 * g)));
    }
    // Q5_0: q - 16, exact as in ggml
    __device__ __forceinline__ static int values(uint32_t w, int g, uint32_t qh) {
        const uint32_t v = quants(w, g, qh);
        return kMin ? int(v) : int(__vsub4(v, 0x10101010u));
    }
    __device__ __forceinline__ static float dequant(float d, float m, int v) {
        return kMin ? d * float(v) + m : d * float(v);
    }
};
using DecodeQ5_0 = DecodeQ5<false>;
using DecodeQ5_1 = DecodeQ5<true>;

struct DecodeQ8_0 {
    static constexpr GGMLType kType = GGMLType::Q8_0;
    static constexpr int kQuantBytes = 32;
    static constexpr bool kHasMin = false, kHighBits = false;
    using Meta = uint16_t;   // f16 d
    __device__ __forceinline__ static float d(Meta m) { return h2f(m); }
    __device__ __forceinline__ static float m(Meta) { return 0.f; }
    __device__ __forceinline__ static uint32_t qh(Meta) { return 0u; }
    __host__ __device__ static constexpr int word(int g) { return g; }
    __device__ __forceinline__ static uint32_t quants(uint32_t w, int, uint32_t) { return w; }
    __device__ __forceinline__ static int values(uint32_t w, int, uint32_t) { return int(w); }
    __device__ __forceinline__ static float dequant(float d, float, int v) { return d * float(v); }
};

// ---- The table types MXFP4 and IQ4_NL, packed as Q4_0 (16 nibble bytes a block; meta: IQ4_NL's
// f16 d, MXFP4's e8m0 exponent in the low byte): values() looks the nibbles up in the type's int8
// table (quant_tables.h), held as four words, with byte permutes.
__host__ __device__ constexpr uint32_t table_word(const int8_t* t, int i) {
    return uint32_t(uint8_t(t[4 * i])) | uint32_t(uint8_t(t[4 * i + 1])) << 8 | uint32_t(uint8_t(t[4 * i + 2])) << 16 |
           uint32_t(uint8_t(t[4 * i + 3])) << 24;
}

// Four indices 0..15 (one a byte) -> the four table bytes: entries 0-7 come from words t0, t1 and
// 8-15 from t2, t3 (a selector's bit 3 would sign-fill, so each permute takes the low 3 bits and
// bit 3 picks the half).
__device__ __forceinline__ uint32_t lookup16(uint32_t idx, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
    const uint32_t sel = (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) | ((idx >> 12) & 0x7000u);
    const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const uint32_t high = ((idx >> 3) & 0x01010101u) * 0xFFu;
    return (hi & high) | (lo & ~high);
}

// MXFP4's scale: half the e8m0 power of two, 2^(e - 128) (e < 2: a subnormal), as bits.
__device__ __forceinline__ float e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

template <bool kMx>
struct DecodeTable4 {
    static constexpr GGMLType kType = kMx ? GGMLType::MXFP4 : GGMLType::IQ4_NL;
    static constexpr int kQuantBytes = 16;
    static constexpr bool kHasMin = false, kHighBits = false;
    static constexpr const int8_t* kTable = kMx ? kvalues_mxfp4 : kvalues_iq4nl;
    static constexpr uint32_t kT0 = table_word(kTable, 0), kT1 = table_word(kTable, 1), kT2 = table_word(kTable, 2),
                              kT3 = table_word(kTable, 3);
    using Meta = uint16_t;
    __device__ __forceinline__ static float d(Meta m) { return kMx ? e8m0_half(m & 0xFFu) : h2f(m); }
    __device__ __forceinline__ static float m(Meta) { return 0.f; }
    __device__ __forceinline__ static uint32_t qh(Meta) { return 0u; }
    __host__ __device__ static constexpr int word(int g) { return g & 3; }
    __device__ __forceinline__ static uint32_t quants(uint32_t w, int g, uint32_t) { return nibbles_of(w, g); }
    __device__ __forceinline__ static int values(uint32_t w, int g, uint32_t) {
        return int(lookup16(nibbles_of(w, g), kT0, kT1, kT2, kT3));
    }
    __device__ __forceinline__ static float dequant(float d, float, int v) { return d * float(v); }
};
using DecodeMXFP4 = DecodeTable4<true>;
using DecodeIQ4_NL = DecodeTable4<false>;

// ---- IQ4_XS, packed: 128 quant bytes a block (sub-block j's 16 nibble bytes at 16 j, laid out as
// an IQ4_NL block's) in the quants region, 8 bytes {f16 d, u16 scales_h, u8 scales_l[4]} in meta.
struct DecodeIQ4_XS {
    static constexpr GGMLType kType = GGMLType::IQ4_XS;
    static constexpr int kQuantBytes = 128;
    using Meta = uint2;
    __device__ __forceinline__ static float d(Meta m) { return h2f(uint16_t(m.x & 0xFFFF)); }
    // the signed scale of sub-block j (0..7)
    __device__ __forceinline__ static int scale(Meta m, int j) {
        const int lo = int(m.y >> (4 * j)) & 0xF, hi = int(m.x >> (16 + 2 * j)) & 3;
        return (lo | (hi << 4)) - 32;
    }
    // group g (0..7) of a sub-block from its word g & 3, as DecodeIQ4_NL
    __device__ __forceinline__ static int values(uint32_t w, int g) {
        return int(
            lookup16(nibbles_of(w, g), DecodeIQ4_NL::kT0, DecodeIQ4_NL::kT1, DecodeIQ4_NL::kT2, DecodeIQ4_NL::kT3));
    }
};

// ---- IQ3_S, packed: 112 quant bytes a block, qs[64] | signs[32] | qh[8] | scales[4] | 4 bytes of pad,
// and f16 d in meta. Point l of sub-block j is iq3s_grid[qs[8 j + l] | bit l of qh[j] << 8] (its 4
// values in bytes), element 4 l + i of the sub-block negated where bit 4 l + i of sign word j is set,
// and the sub-block's scale 1 + 2 * nibble j % 2 of scales[j / 2]. The grid lives in global memory:
// each lane reads its own point, which the constant cache would serialize.
static __device__ const Grid512 kIq3sGrid = iq3s_grid;
static __device__ const Grid256 kIq3xxsGrid = iq3xxs_grid;
static __device__ const Grid512 kIq2xxsGrid = iq2xxs_grid;
static __device__ const Grid1024 kIq2xsGrid = iq2xs_grid;
static __device__ const Grid2048 kIq2sGrid = iq2s_grid;

// ksigns_iq2xs[i]: the 7 stored sign bits and their parity as bit 7.
__device__ __forceinline__ uint32_t ksigns8(uint32_t i) { return i | (uint32_t(__popc(i) & 1) << 7); }

// A grid point's 4 values as signed bytes, negated where the 4 sign bits (bits 0..3) are set.
__device__ __forceinline__ int signed_point(uint32_t point, uint32_t signs4) {
    const uint32_t neg = uint32_t(spread4_bit4(signs4) >> 4) * 0xFFu;
    return int(__vsub4(point ^ neg, neg));
}

struct DecodeIQ3_S {
    static constexpr GGMLType kType = GGMLType::IQ3_S;
    static constexpr int kQuantBytes = 112, kSigns = 64, kTail = 96;   // tail: qh[8], scales[4]
    using Meta = uint16_t;
    __device__ __forceinline__ static float d(Meta m) { return h2f(m); }
    // tail words x, y (qh) and z (scales): the qh byte and the scale of sub-block j
    __device__ __forceinline__ static uint32_t qh(uint4 tail, int j) { return byte_of(tail.x, tail.y, 0, 0, j); }
    __device__ __forceinline__ static int scale(uint4 tail, int j) { return 1 + 2 * int((tail.z >> (4 * j)) & 0xF); }
    __device__ __forceinline__ static int values(uint32_t qs_byte, uint32_t qh_bit, uint32_t signs4) {
        return signed_point(__ldg(&kIq3sGrid.v[qs_byte | (qh_bit << 8)]), signs4);
    }
};

// ---- IQ3_XXS, packed: its 96 quant bytes (qs[64], then sub-block j's word at 64 + 4 j: four 7-bit
// sign indices and the scale s in the top 4 bits), f16 d in meta. Each index's 8 signs are its 7
// bits and their parity as bit 7 (ksigns_iq2xs, computed here).
struct DecodeIQ3_XXS {
    static constexpr GGMLType kType = GGMLType::IQ3_XXS;
    static constexpr int kQuantBytes = 96, kAux = 64;
    using Meta = uint16_t;
    // d / 4: times scale() it is gguf's d * (s + 1/2) / 2
    __device__ __forceinline__ static float d(Meta m) { return h2f(m) * 0.25f; }
    __device__ __forceinline__ static int scale(uint32_t aux) { return 2 * int(aux >> 28) + 1; }
    // the 32 sign bits of a sub-block (bit e for its element e)
    __device__ __forceinline__ static uint32_t signs(uint32_t aux) {
        uint32_t s = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) s |= ksigns8((aux >> (7 * k)) & 127u) << (8 * k);
        return s;
    }
    __device__ __forceinline__ static int values(uint32_t qs_byte, uint32_t signs4) {
        return signed_point(__ldg(&kIq3xxsGrid.v[qs_byte]), signs4);
    }
};

// ---- IQ2_XXS, packed: its 64 quant bytes (sub-block j: words 2 j, 2 j + 1: four indices of
// 8-value points, then signs and scale as IQ3_XXS's), f16 d in meta.
struct DecodeIQ2_XXS {
    static constexpr GGMLType kType = GGMLType::IQ2_XXS;
    static constexpr int kQuantBytes = 64;
    using Meta = uint16_t;
    // d / 8: times the scale it is gguf's d * (s + 1/2) / 4
    __device__ __forceinline__ static float d(Meta m) { return h2f(m) * 0.125f; }
    // group g (values 4 g .. 4 g + 3) of a sub-block: half g % 2 of point g / 2 with its signs
    __device__ __forceinline__ static int values(uint32_t idx4, uint32_t signs, int g) {
        const uint32_t point = (idx4 >> (8 * (g >> 1))) & 0xFF;
        return signed_point(__ldg(&kIq2xxsGrid.v[2 * point + (g & 1)]), signs >> (4 * g));
    }
};

// ---- IQ2_XS, packed: 80 quant bytes a block (qs[32] as u16: 9-bit index of an 8-value point and
// 7 sign bits; scales[8], a nibble per 16 values; 8 bytes of pad), f16 d in meta. Sub-block j is
// points 4 j .. 4 j + 3, read as one uint2.
struct DecodeIQ2_XS {
    static constexpr GGMLType kType = GGMLType::IQ2_XS;
    static constexpr int kQuantBytes = 80, kScales = 64;
    using Meta = uint16_t;
    // d / 8: times the scale it is gguf's d * (s + 1/2) / 4
    __device__ __forceinline__ static float d(Meta m) { return h2f(m) * 0.125f; }
    // the scale 2 s + 1 of half h (16 values) of a sub-block from its scales byte
    __device__ __forceinline__ static int scale(uint32_t b, int h) { return 2 * int((b >> (4 * h)) & 0xF) + 1; }
    // group g (values 4 g .. 4 g + 3) of a sub-block: half g % 2 of point g / 2 with its signs
    __device__ __forceinline__ static int values(uint2 q, int g) {
        const uint32_t pt = ((g < 4 ? q.x : q.y) >> (16 * ((g >> 1) & 1))) & 0xFFFF;
        return signed_point(__ldg(&kIq2xsGrid.v[2 * (pt & 511) + (g & 1)]), ksigns8(pt >> 9) >> (4 * (g & 1)));
    }
};

// ---- IQ2_S, packed: its 80 quant bytes (qs[32] | signs[32] | qh[8] | scales[8]), f16 d in meta.
// Sub-block j is points 4 j .. 4 j + 3: qs word j, sign word j, qh byte j, scales byte j.
struct DecodeIQ2_S {
    static constexpr GGMLType kType = GGMLType::IQ2_S;
    static constexpr int kQuantBytes = 80, kSigns = 32, kTail = 64;   // tail: qh[8], scales[8]
    using Meta = uint16_t;
    __device__ __forceinline__ static float d(Meta m) { return h2f(m) * 0.125f; }
    // group g (values 4 g .. 4 g + 3) of a sub-block: half g % 2 of point g / 2 (index: its qs byte
    // and 2 bits of the qh byte) with its signs
    __device__ __forceinline__ static int values(uint32_t qs4, uint32_t qh, uint32_t signs, int g) {
        const int l = g >> 1;
        const uint32_t pt = ((qs4 >> (8 * l)) & 0xFF) | (((qh >> (2 * l)) & 3u) << 8);
        return signed_point(__ldg(&kIq2sGrid.v[2 * pt + (g & 1)]), signs >> (4 * g));
    }
};

// ---- Q4_K / Q5_K (raw 144 / 176-byte blocks of 256): a 16-byte header (f16 d | f16 dmin << 16,
// then 12 bytes of 6-bit scales and mins of the 8 sub-blocks of 32), for Q5_K 32 bytes of qh, then
// 4 chunks of 32 quant bytes, chunk c holding sub-block 2c in its low nibbles and 2c + 1 in its
// high ones. Bit 4 of element l of sub-block j (Q5_K) is bit j of qh[l].
template <bool kQ5>
struct DecodeQK {
    static constexpr GGMLType kType = kQ5 ? GGMLType::Q5_K : GGMLType::Q4_K;
    static constexpr int kBlockBytes = kQ5 ? 176 : 144;
    static constexpr int kQhOffset = 16, kQsOffset = kQ5 ? 48 : 16;   // bytes into the block
    __device__ __forceinline__ static float d(uint32_t h0) { return h2f(uint16_t(h0 & 0xFFFF)); }
    __device__ __forceinline__ static float dmin(uint32_t h0) { return h2f(uint16_t(h0 >> 16)); }
    // The 6-bit scale and min of sub-block j (0..7) from header words 1..3.
    __device__ __forceinline__ static void scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, float& sc,
                                                     float& mn) {
        if (j < 4) {
            sc = float(byte_of(s0, s1, s2, 0, j) & 63);
            mn = float(byte_of(s0, s1, s2, 0, j + 4) & 63);
        } else {
            const uint32_t a = byte_of(s0, s1, s2, 0, j + 4), lo = byte_of(s0, s1, s2, 0, j - 4),
                           hi = byte_of(s0, s1, s2, 0, j);
            sc = float((a & 0xF) | ((lo >> 6) << 4));
            mn = float((a >> 4) | ((hi >> 6) << 4));
        }
    }
    // Four quants of sub-block j: word k of chunk j / 2 (q) and word k of qh (h, Q5_K only) give
    // elements 4k..4k+3 of the sub-block.
    __device__ __forceinline__ static uint32_t quants(uint32_t q, uint32_t h, int j) {
        const uint32_t lo = (j & 1 ? q >> 4 : q) & 0x0F0F0F0Fu;
        return kQ5 ? lo | (((h >> j) & 0x01010101u) << 4) : lo;
    }
};

// ---- Q6_K, packed: 192 quant bytes a block (ql[128], qh[64]) in the quants region, the 16 int8
// sub-block scales in meta, f16 d in meta2. Element 128 h + 32 k + l (quarter k of half h) has its
// low 4 bits in nibble k / 2 of ql[64 h + 32 (k & 1) + l], its high 2 in bits 2k, 2k + 1 of
// qh[32 h + l], and scale 8 h + 2 k + l / 16.
struct DecodeQ6_K {
    static constexpr GGMLType kType = GGMLType::Q6_K;
    static constexpr int kQuantBytes = 192;
    // Element l of quarter k of half h has its ql byte at qs + h * kQlHalf + (k & 1) * kQlOdd + l
    // and its qh byte at qs + kQh + h * kQhHalf + l (qs: the block's quants). Constants, not
    // functions: the kernels' address arithmetic then folds as if written out.
    static constexpr int kQlHalf = 64, kQlOdd = 32, kQh = 128, kQhHalf = 32;
    // The scale of element l (0..31) of quarter k of half h.
    __host__ __device__ static constexpr int scale_index(int h, int k, int l) { return h * 8 + (l >> 4) + 2 * k; }
    // Four consecutive l of quarter k from their ql and qh words: the 6-bit quants (bits 2k, 2k + 1
    // of each qh byte go to bits 4, 5).
    __device__ __forceinline__ static uint32_t quants(uint32_t ql, uint32_t qh, int k) {
        const uint32_t hi = (k == 0 ? qh << 4 : k == 1 ? qh << 2 : k == 2 ? qh : qh >> 2) & 0x30303030u;
        return ((k >= 2 ? ql >> 4 : ql) & 0x0F0F0F0Fu) | hi;
    }
    // q - 32 as signed bytes
    __device__ __forceinline__ static int values(uint32_t ql, uint32_t qh, int k) {
        return int(__vsub4(quants(ql, qh, k), 0x20202020u));
    }
};

// ---- F32 / F16 / BF16: 16 bytes of a row as floats (4 or 8).
template <class T>
struct DecodeFloat {
    static constexpr int kPer = 16 / sizeof(T);
    __device__ __forceinline__ static void to_float(uint4 v, float (&f)[8]) {
        if constexpr (sizeof(T) == 4) {
            f[0] = __uint_as_float(v.x);
            f[1] = __uint_as_float(v.y);
            f[2] = __uint_as_float(v.z);
            f[3] = __uint_as_float(v.w);
        } else {
            const uint32_t qq[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                float2 h;
                if constexpr (std::is_same<T, __half>::value)
                    h = __half22float2(*reinterpret_cast<const __half2*>(&qq[k]));
                else h = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qq[k]));
                f[2 * k] = h.x;
                f[2 * k + 1] = h.y;
            }
        }
    }
};

// The decoder of a type, for kernels templated on GGMLType.
// clang-format off: one row a type
template <GGMLType T> struct BlockDecoder;
template <> struct BlockDecoder<GGMLType::Q4_0> { using type = DecodeQ4_0; };
template <> struct BlockDecoder<GGMLType::Q4_1> { using type = DecodeQ4_1; };
template <> struct BlockDecoder<GGMLType::Q5_0> { using type = DecodeQ5_0; };
template <> struct BlockDecoder<GGMLType::Q5_1> { using type = DecodeQ5_1; };
template <> struct BlockDecoder<GGMLType::Q8_0> { using type = DecodeQ8_0; };
template <> struct BlockDecoder<GGMLType::Q4_K> { using type = DecodeQK<false>; };
template <> struct BlockDecoder<GGMLType::Q5_K> { using type = DecodeQK<true>; };
template <> struct BlockDecoder<GGMLType::Q6_K> { using type = DecodeQ6_K; };
template <> struct BlockDecoder<GGMLType::MXFP4> { using type = DecodeMXFP4; };
template <> struct BlockDecoder<GGMLType::IQ4_NL> { using type = DecodeIQ4_NL; };
template <> struct BlockDecoder<GGMLType::IQ4_XS> { using type = DecodeIQ4_XS; };
template <> struct BlockDecoder<GGMLType::IQ3_S> { using type = DecodeIQ3_S; };
template <> struct BlockDecoder<GGMLType::IQ3_XXS> { using type = DecodeIQ3_XXS; };
template <> struct BlockDecoder<GGMLType::IQ2_XXS> { using type = DecodeIQ2_XXS; };
template <> struct BlockDecoder<GGMLType::IQ2_XS> { using type = DecodeIQ2_XS; };
template <> struct BlockDecoder<GGMLType::IQ2_S> { using type = DecodeIQ2_S; };
template <> struct BlockDecoder<GGMLType::F32> { using type = DecodeFloat<float>; };
template <> struct BlockDecoder<GGMLType::F16> { using type = DecodeFloat<__half>; };
template <> struct BlockDecoder<GGMLType::BF16> { using type = DecodeFloat<__nv_bfloat16>; };
// clang-format on

}  // namespace cuda
}  // namespace ember

#include "block_decode_low_bit.cuh"
#include "block_decode_q2_q3.cuh"
