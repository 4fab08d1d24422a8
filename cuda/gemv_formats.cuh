// Per-format dot products of the decode GEMV: each format splits a weight row into "units"
// (a lane's share of one step) and accumulates unit . x for NT tokens. Integer formats
// read activations as q8_1 blocks (int8 + (d, d*sum)) and multiply with dp4a; float formats
// read float activations. Weight bytes are streamed with 16-byte loads, each read once.
// (Rows of the 32-element block formats up to kLegacyExactMaxWidth wide sum in the CPU's order
// instead: gemv_legacy.cuh.)
#pragma once
#include "block_decode.cuh"
#include "common.cuh"
#include "weight_pack.h"

namespace ember {
namespace cuda {

struct GemvParams {
    const uint8_t* w;
    const uint8_t* meta;
    const uint8_t* meta2;
    int64_t n_in, n_out;
    int64_t n_blocks;          // weight blocks per row
    int32_t units;             // units per row
    const float* x;            // [n_tok][n_in] float formats
    const int8_t* xq;          // [n_tok][n_in] integer formats
    const float2* xds;         // [n_tok][n_in/32]
    float* y;                  // [n_tok][n_out]
};

// Sum of dp4a over 8 words of weights against 32 int8 activations (two int4).
__device__ __forceinline__ int dot32(const int (&w)[8], int4 a, int4 b) {
    int s = dp4a(w[0], a.x, 0);
    s = dp4a(w[1], a.y, s);
    s = dp4a(w[2], a.z, s);
    s = dp4a(w[3], a.w, s);
    s = dp4a(w[4], b.x, s);
    s = dp4a(w[5], b.y, s);
    s = dp4a(w[6], b.z, s);
    s = dp4a(w[7], b.w, s);
    return s;
}
__device__ __forceinline__ int dot16(int w0, int w1, int w2, int w3, int4 a) {
    return dp4a(w3, a.w, dp4a(w2, a.z, dp4a(w1, a.y, dp4a(w0, a.x, 0))));
}
__device__ __forceinline__ void load_x32(const GemvParams& p, int t, int64_t xblock, int4& a, int4& b) {
    const int4* xp = reinterpret_cast<const int4*>(p.xq + t * p.n_in + xblock * 32);
    a = xp[0];
    b = xp[1];
}
__device__ __forceinline__ float2 load_ds(const GemvParams& p, int t, int64_t xblock) {
    return p.xds[t * (p.n_in / 32) + xblock];
}

// Each format: Data (a unit's weight bytes in registers), load() (issues the unit's weight loads
// only, so the GEMV can put several units' loads in flight before any use), dot() (the math,
// reading the cached activations) and kDepth (units per lane in flight).

// The 32-element block types (block_decode.cuh): a unit is one block (16 bytes of nibbles or, for
// Q8_0, 32 int8) and its metadata entry.
template <class D>
struct FmtBlock32 {
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    static constexpr int kChunks = D::kQuantBytes / 16;
    struct Data {
        uint4 q[kChunks];
        typename D::Meta meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + u;
        Data v;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) v.q[c] = ld_stream(p.w + b * D::kQuantBytes + 16 * c);
        v.meta = __ldg(reinterpret_cast<const typename D::Meta*>(p.meta) + b);
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const float d = D::d(v.meta), m = D::m(v.meta);
        const uint32_t qh = D::qh(v.meta);
        uint32_t words[4 * kChunks];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            words[4 * c] = v.q[c].x;
            words[4 * c + 1] = v.q[c].y;
            words[4 * c + 2] = v.q[c].z;
            words[4 * c + 3] = v.q[c].w;
        }
        int w[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) w[g] = D::values(words[D::word(g)], g, qh);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            if constexpr (D::kHasMin) {
                const float2 ds = load_ds(p, t, u);
                acc[t] += d * ds.x * float(dot32(w, a, c)) + m * ds.y;
            } else {
                acc[t] += d * load_ds(p, t, u).x * float(dot32(w, a, c));
            }
        }
    }
};

// Q4_K / Q5_K (raw blocks, block_decode.cuh): a unit is 64 elements = 32 quant bytes whose low
// nibbles are sub-block 2jp and high nibbles sub-block 2jp+1.
template <bool kQ5>
struct FmtQK {
    using D = DecodeQK<kQ5>;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint4 hdr, qa, qb, ha, hb;
    };   // ha, hb: the block's 32 qh bytes (Q5_K)
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const uint8_t* base = p.w + (row * p.n_blocks + (u >> 2)) * D::kBlockBytes;
        const uint8_t* qs = base + D::kQsOffset + 32 * (u & 3);
        Data v{};
        v.hdr = ld_stream(base);   // f16 d, f16 dmin, 12 bytes of scales (4 lanes share it)
        v.qa = ld_stream(qs);
        v.qb = ld_stream(qs + 16);
        if (kQ5) {
            v.ha = ld_stream(base + D::kQhOffset);
            v.hb = ld_stream(base + D::kQhOffset + 16);
        }
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const int jp = u & 3;
        const int64_t blk = u >> 2;
        const float d = D::d(v.hdr.x), dmin = D::dmin(v.hdr.x);
        float sc1, m1, sc2, m2;
        D::scale_min(v.hdr.y, v.hdr.z, v.hdr.w, 2 * jp, sc1, m1);
        D::scale_min(v.hdr.y, v.hdr.z, v.hdr.w, 2 * jp + 1, sc2, m2);
        const uint32_t q[8] = {v.qa.x, v.qa.y, v.qa.z, v.qa.w, v.qb.x, v.qb.y, v.qb.z, v.qb.w};
        const uint32_t h[8] = {v.ha.x, v.ha.y, v.ha.z, v.ha.w, v.hb.x, v.hb.y, v.hb.z, v.hb.w};
        int lo[8], hi[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            lo[k] = int(D::quants(q[k], h[k], 2 * jp));
            hi[k] = int(D::quants(q[k], h[k], 2 * jp + 1));
        }
        const int64_t xb = blk * 8 + 2 * jp;
        const float d1 = d * sc1, d2 = d * sc2, n1 = dmin * m1, n2 = dmin * m2;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c, e, f;
            load_x32(p, t, xb, a, c);
            load_x32(p, t, xb + 1, e, f);
            const float2 ds1 = load_ds(p, t, xb), ds2 = load_ds(p, t, xb + 1);
            acc[t] += d1 * ds1.x * float(dot32(lo, a, c)) - n1 * ds1.y + d2 * ds2.x * float(dot32(hi, e, f)) -
                      n2 * ds2.y;
        }
    }
};

// IQ4_XS (packed, block_decode.cuh): a unit is one sub-block of 32 (its 16 nibble bytes) and the
// block's metadata entry, against activation block u.
struct FmtIQ4_XS {
    using D = DecodeIQ4_XS;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint4 q;
        uint2 meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 3);
        Data v;
        v.q = ld_stream(p.w + b * D::kQuantBytes + 16 * (u & 7));
        v.meta = __ldg(reinterpret_cast<const uint2*>(p.meta) + b);
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const float dl = D::d(v.meta) * float(D::scale(v.meta, u & 7));
        const uint32_t words[4] = {v.q.x, v.q.y, v.q.z, v.q.w};
        int w[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) w[g] = D::values(words[g & 3], g);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            acc[t] += dl * load_ds(p, t, u).x * float(dot32(w, a, c));
        }
    }
};

// IQ3_S (packed, block_decode.cuh): a unit is one sub-block of 32 (8 qs bytes, a sign word, the
// block's qh and scales) against activation block u.
struct FmtIQ3_S {
    using D = DecodeIQ3_S;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint2 q;
        uint32_t signs;
        uint4 tail;
        uint16_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 3);
        const uint8_t* base = p.w + b * D::kQuantBytes;
        const int j = u & 7;
        Data v;
        v.q = *reinterpret_cast<const uint2*>(base + 8 * j);
        v.signs = *reinterpret_cast<const uint32_t*>(base + D::kSigns + 4 * j);
        v.tail = ld_stream(base + D::kTail);
        v.meta = __ldg(reinterpret_cast<const uint16_t*>(p.meta) + b);
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const int j = u & 7;
        const float dl = D::d(v.meta) * float(D::scale(v.tail, j));
        const uint32_t qh = D::qh(v.tail, j);
        int w[8];
#pragma unroll
        for (int l = 0; l < 8; ++l)
            w[l] = D::values(((l < 4 ? v.q.x : v.q.y) >> (8 * (l & 3))) & 0xFF, (qh >> l) & 1, v.signs >> (4 * l));
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            acc[t] += dl * load_ds(p, t, u).x * float(dot32(w, a, c));
        }
    }
};

// IQ3_XXS (packed, block_decode.cuh): a unit is one sub-block of 32 (8 qs bytes and its word of
// signs and scale) against activation block u.
struct FmtIQ3_XXS {
    using D = DecodeIQ3_XXS;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint2 q;
        uint32_t aux;
        uint16_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 3);
        const uint8_t* base = p.w + b * D::kQuantBytes;
        Data v;
        v.q = *reinterpret_cast<const uint2*>(base + 8 * (u & 7));
        v.aux = *reinterpret_cast<const uint32_t*>(base + D::kAux + 4 * (u & 7));
        v.meta = __ldg(reinterpret_cast<const uint16_t*>(p.meta) + b);
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const float dl = D::d(v.meta) * float(D::scale(v.aux));
        const uint32_t signs = D::signs(v.aux);
        int w[8];
#pragma unroll
        for (int l = 0; l < 8; ++l)
            w[l] = D::values(((l < 4 ? v.q.x : v.q.y) >> (8 * (l & 3))) & 0xFF, signs >> (4 * l));
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            acc[t] += dl * load_ds(p, t, u).x * float(dot32(w, a, c));
        }
    }
};

// IQ2_XXS (packed, block_decode.cuh): a unit is one sub-block of 32 (its two words) against
// activation block u.
struct FmtIQ2_XXS {
    using D = DecodeIQ2_XXS;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint2 q;
        uint16_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 3);
        Data v;
        v.q = *reinterpret_cast<const uint2*>(p.w + b * D::kQuantBytes + 8 * (u & 7));
        v.meta = __ldg(reinterpret_cast<const uint16_t*>(p.meta) + b);
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const float dl = D::d(v.meta) * float(DecodeIQ3_XXS::scale(v.q.y));
        const uint32_t signs = DecodeIQ3_XXS::signs(v.q.y);
        int w[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) w[g] = D::values(v.q.x, signs, g);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            acc[t] += dl * load_ds(p, t, u).x * float(dot32(w, a, c));
        }
    }
};

// IQ2_XS (packed, block_decode.cuh): a unit is one sub-block of 32 (four points, its scales byte)
// against activation block u; its two halves of 16 have their own scale.
struct FmtIQ2_XS {
    using D = DecodeIQ2_XS;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint2 q;
        uint32_t scales;
        uint16_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 3);
        const uint8_t* base = p.w + b * D::kQuantBytes;
        Data v;
        v.q = *reinterpret_cast<const uint2*>(base + 8 * (u & 7));
        v.scales = *reinterpret_cast<const uint32_t*>(base + D::kScales + 4 * ((u & 7) >> 2));
        v.meta = __ldg(reinterpret_cast<const uint16_t*>(p.meta) + b);
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const uint32_t sb = (v.scales >> (8 * (u & 3))) & 0xFF;
        const int s0 = D::scale(sb, 0), s1 = D::scale(sb, 1);
        int lo[8] = {}, hi[8] = {};
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            lo[g] = D::values(v.q, g);
            hi[g + 4] = D::values(v.q, g + 4);
        }
        const float d = D::d(v.meta);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            acc[t] += d * load_ds(p, t, u).x * float(s0 * dot32(lo, a, c) + s1 * dot32(hi, a, c));
        }
    }
};

// IQ2_S (packed, block_decode.cuh): a unit is one sub-block of 32 (qs and sign words, the block's
// qh and scales) against activation block u; its two halves of 16 have their own scale.
struct FmtIQ2_S {
    using D = DecodeIQ2_S;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint32_t qs, signs;
        uint4 tail;
        uint16_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 3);
        const uint8_t* base = p.w + b * D::kQuantBytes;
        Data v;
        v.qs = *reinterpret_cast<const uint32_t*>(base + 4 * (u & 7));
        v.signs = *reinterpret_cast<const uint32_t*>(base + D::kSigns + 4 * (u & 7));
        v.tail = ld_stream(base + D::kTail);
        v.meta = __ldg(reinterpret_cast<const uint16_t*>(p.meta) + b);
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const int j = u & 7;
        const uint32_t qh = byte_of(v.tail.x, v.tail.y, 0, 0, j), sb = byte_of(0, 0, v.tail.z, v.tail.w, 8 + j);
        const int s0 = DecodeIQ2_XS::scale(sb, 0), s1 = DecodeIQ2_XS::scale(sb, 1);
        int lo[8] = {}, hi[8] = {};
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            lo[g] = D::values(v.qs, qh, v.signs, g);
            hi[g + 4] = D::values(v.qs, qh, v.signs, g + 4);
        }
        const float d = D::d(v.meta);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            acc[t] += d * load_ds(p, t, u).x * float(s0 * dot32(lo, a, c) + s1 * dot32(hi, a, c));
        }
    }
};

// Q6_K (packed, block_decode.cuh): a unit is 16 consecutive l of one 128-element half: elements
// l, l+32, l+64, l+96 (four sub-blocks of 16).
struct FmtQ6_K {
    using D = DecodeQ6_K;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint4 A, B, H, S;
        uint16_t d;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 2);
        const int h = (u >> 1) & 1, l0 = 16 * (u & 1);
        const uint8_t* qs = p.w + b * D::kQuantBytes;
        return {ld_stream(qs + h * D::kQlHalf + l0), ld_stream(qs + h * D::kQlHalf + D::kQlOdd + l0),
                ld_stream(qs + D::kQh + h * D::kQhHalf + l0), __ldg(reinterpret_cast<const uint4*>(p.meta) + b),
                __ldg(reinterpret_cast<const uint16_t*>(p.meta2) + b)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const int64_t blk = u >> 2;
        const int h = (u >> 1) & 1, l0 = 16 * (u & 1);
        const float d = h2f(v.d);
        const uint32_t a[4] = {v.A.x, v.A.y, v.A.z, v.A.w}, bb[4] = {v.B.x, v.B.y, v.B.z, v.B.w},
                       hh[4] = {v.H.x, v.H.y, v.H.z, v.H.w};
        int q[4][4];   // [quarter][word]
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int j = 0; j < 4; ++j) q[j][k] = D::values(j & 1 ? bb[k] : a[k], hh[k], j);
        float sc[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            sc[k] = d * float(int8_t(byte_of(v.S.x, v.S.y, v.S.z, v.S.w, D::scale_index(h, k, l0))));
        const int64_t xb = blk * 8 + h * 4;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int4 xa = *reinterpret_cast<const int4*>(p.xq + t * p.n_in + (xb + k) * 32 + l0);
                s += sc[k] * load_ds(p, t, xb + k).x * float(dot16(q[k][0], q[k][1], q[k][2], q[k][3], xa));
            }
            acc[t] += s;
        }
    }
};

// Float weights: a unit is 16 bytes of the row (8 halves / bf16s or 4 floats).
template <class T>
struct FmtFloat {
    static constexpr bool kWholeRow = false;
    static constexpr int kPer = DecodeFloat<T>::kPer;
    static constexpr int kDepth = 4;
    struct Data {
        uint4 q;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        return {ld_stream(p.w + (row * p.n_in + int64_t(u) * kPer) * sizeof(T))};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        float wf[8];
        DecodeFloat<T>::to_float(v.q, wf);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float4* xp = reinterpret_cast<const float4*>(p.x + t * p.n_in + int64_t(u) * kPer);
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < kPer / 4; ++k) {
                const float4 xv = __ldg(xp + k);
                s += wf[4 * k] * xv.x + wf[4 * k + 1] * xv.y + wf[4 * k + 2] * xv.z + wf[4 * k + 3] * xv.w;
            }
            acc[t] += s;
        }
    }
};

}  // namespace cuda
}  // namespace ember

#include "gemv_formats_low_bit.cuh"
#include "gemv_formats_q2_q3.cuh"
