// Per-format dot products of the decode GEMV: each format splits a weight row into "units"
// (a lane's share of one step) and accumulates unit . x for NT tokens. Integer formats
// read activations as q8_1 blocks (int8 + (d, d*sum)) and multiply with dp4a; float formats
// read float activations. Weight bytes are streamed with 16-byte loads, each read once.
// (Rows of the 32-element block formats up to kLegacyExactMaxWidth wide sum in the CPU's order
// instead: gemv_legacy.cuh.)
#pragma once
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

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Sum of dp4a over 8 words of weights against 32 int8 activations (two int4).
__device__ __forceinline__ int dot32(const int (&w)[8], int4 a, int4 b) {
    int s = dp4a(w[0], a.x, 0);
    s = dp4a(w[1], a.y, s); s = dp4a(w[2], a.z, s); s = dp4a(w[3], a.w, s);
    s = dp4a(w[4], b.x, s); s = dp4a(w[5], b.y, s); s = dp4a(w[6], b.z, s); s = dp4a(w[7], b.w, s);
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

// Q4_0 / Q4_1 / Q5_0 / Q5_1: a unit is one 32-element block (16 bytes of nibbles: byte j
// holds element j low, element j+16 high). Q8_0: one block of 32 int8.
__device__ __forceinline__ void nibbles(const uint4& q, int (&w)[8]) {
    w[0] = int(q.x & 0x0F0F0F0F); w[1] = int(q.y & 0x0F0F0F0F); w[2] = int(q.z & 0x0F0F0F0F); w[3] = int(q.w & 0x0F0F0F0F);
    w[4] = int((q.x >> 4) & 0x0F0F0F0F); w[5] = int((q.y >> 4) & 0x0F0F0F0F);
    w[6] = int((q.z >> 4) & 0x0F0F0F0F); w[7] = int((q.w >> 4) & 0x0F0F0F0F);
}

struct FmtQ4_0 {
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data { uint4 q; uint16_t d; };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + u;
        return {ld_stream(p.w + b * 16), __ldg(reinterpret_cast<const uint16_t*>(p.meta) + b)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const float d = h2f(v.d);
        int w[8];
        nibbles(v.q, w);
        // q - 8 as signed bytes: the integer dot is exact, as in ggml's q4_0 x q8_0.
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = int(__vsub4(uint32_t(w[k]), 0x08080808u));
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            acc[t] += d * load_ds(p, t, u).x * float(dot32(w, a, c));
        }
    }
};

struct FmtQ4_1 {
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data { uint4 q; uint32_t dm; };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + u;
        return {ld_stream(p.w + b * 16), __ldg(reinterpret_cast<const uint32_t*>(p.meta) + b)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const float d = h2f(uint16_t(v.dm & 0xFFFF)), m = h2f(uint16_t(v.dm >> 16));
        int w[8];
        nibbles(v.q, w);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            const float2 ds = load_ds(p, t, u);
            acc[t] += d * ds.x * float(dot32(w, a, c)) + m * ds.y;
        }
    }
};

template <bool kHasMin>
struct FmtQ5 {
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data { uint4 q; uint2 mt; };   // mt: {d | m << 16, qh}
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + u;
        return {ld_stream(p.w + b * 16), __ldg(reinterpret_cast<const uint2*>(p.meta) + b)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const float d = h2f(uint16_t(v.mt.x & 0xFFFF)), m = h2f(uint16_t(v.mt.x >> 16));
        const uint32_t qh = v.mt.y;
        int w[8];
        nibbles(v.q, w);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            w[k] |= spread4_bit4(qh >> (4 * k));
            if (!kHasMin) w[k] = int(__vsub4(uint32_t(w[k]), 0x10101010u));   // q - 16, exact as in ggml
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            const float2 ds = load_ds(p, t, u);
            if (kHasMin)
                acc[t] += d * ds.x * float(dot32(w, a, c)) + m * ds.y;
            else
                acc[t] += d * ds.x * float(dot32(w, a, c));
        }
    }
};

struct FmtQ8_0 {
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data { uint4 q0, q1; uint16_t d; };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + u;
        return {ld_stream(p.w + b * 32), ld_stream(p.w + b * 32 + 16), __ldg(reinterpret_cast<const uint16_t*>(p.meta) + b)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const float d = h2f(v.d);
        const int w[8] = {int(v.q0.x), int(v.q0.y), int(v.q0.z), int(v.q0.w), int(v.q1.x), int(v.q1.y), int(v.q1.z), int(v.q1.w)};
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            acc[t] += d * load_ds(p, t, u).x * float(dot32(w, a, c));
        }
    }
};

// Byte i (runtime, 0..15) of four words.
__device__ __forceinline__ uint32_t byte_of(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int i) {
    const uint32_t w = i < 8 ? (i < 4 ? w0 : w1) : (i < 12 ? w2 : w3);
    return (w >> (8 * (i & 3))) & 0xFF;
}

// K-quant 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
__device__ __forceinline__ void kq_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, float& sc, float& mn) {
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

// Q4_K / Q5_K (raw 144 / 176-byte blocks of 256): a unit is 64 elements = 32 quant bytes
// whose low nibbles are sub-block 2jp and high nibbles sub-block 2jp+1.
template <bool kQ5>
struct FmtQK {
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    static constexpr int kBlockBytes = kQ5 ? 176 : 144;
    struct Data { uint4 hdr, qa, qb, ha, hb; };   // ha, hb: the block's 32 qh bytes (Q5_K)
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const uint8_t* base = p.w + (row * p.n_blocks + (u >> 2)) * kBlockBytes;
        const uint8_t* qs = base + (kQ5 ? 48 : 16) + 32 * (u & 3);
        Data v;
        v.hdr = ld_stream(base);   // f16 d, f16 dmin, 12 bytes of scales (4 lanes share it)
        v.qa = ld_stream(qs);
        v.qb = ld_stream(qs + 16);
        if (kQ5) {
            v.ha = ld_stream(base + 16);
            v.hb = ld_stream(base + 32);
        }
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const int jp = u & 3;
        const int64_t blk = u >> 2;
        const float d = h2f(uint16_t(v.hdr.x & 0xFFFF)), dmin = h2f(uint16_t(v.hdr.x >> 16));
        float sc1, m1, sc2, m2;
        kq_scale_min(v.hdr.y, v.hdr.z, v.hdr.w, 2 * jp, sc1, m1);
        kq_scale_min(v.hdr.y, v.hdr.z, v.hdr.w, 2 * jp + 1, sc2, m2);
        const uint32_t q[8] = {v.qa.x, v.qa.y, v.qa.z, v.qa.w, v.qb.x, v.qb.y, v.qb.z, v.qb.w};
        int lo[8], hi[8];
        if (kQ5) {
            const uint32_t h[8] = {v.ha.x, v.ha.y, v.ha.z, v.ha.w, v.hb.x, v.hb.y, v.hb.z, v.hb.w};
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                lo[k] = int((q[k] & 0x0F0F0F0F) | (((h[k] >> (2 * jp)) & 0x01010101) << 4));
                hi[k] = int(((q[k] >> 4) & 0x0F0F0F0F) | (((h[k] >> (2 * jp + 1)) & 0x01010101) << 4));
            }
        } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                lo[k] = int(q[k] & 0x0F0F0F0F);
                hi[k] = int((q[k] >> 4) & 0x0F0F0F0F);
            }
        }
        const int64_t xb = blk * 8 + 2 * jp;
        const float d1 = d * sc1, d2 = d * sc2, n1 = dmin * m1, n2 = dmin * m2;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c, e, f;
            load_x32(p, t, xb, a, c);
            load_x32(p, t, xb + 1, e, f);
            const float2 ds1 = load_ds(p, t, xb), ds2 = load_ds(p, t, xb + 1);
            acc[t] += d1 * ds1.x * float(dot32(lo, a, c)) - n1 * ds1.y +
                      d2 * ds2.x * float(dot32(hi, e, f)) - n2 * ds2.y;
        }
    }
};

// Q6_K (packed: 192 quant bytes ql[128] qh[64] per block, scales and d apart): a unit is
// 16 consecutive l of one 128-element half: elements l, l+32, l+64, l+96 (four sub-blocks of 16).
struct FmtQ6_K {
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data { uint4 A, B, H, S; uint16_t d; };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 2);
        const int h = (u >> 1) & 1, l0 = 16 * (u & 1);
        const uint8_t* qs = p.w + b * 192;
        return {ld_stream(qs + h * 64 + l0), ld_stream(qs + h * 64 + 32 + l0), ld_stream(qs + 128 + h * 32 + l0),
                __ldg(reinterpret_cast<const uint4*>(p.meta) + b), __ldg(reinterpret_cast<const uint16_t*>(p.meta2) + b)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const int64_t blk = u >> 2;
        const int h = (u >> 1) & 1, l0 = 16 * (u & 1);
        const float d = h2f(v.d);
        const uint32_t a[4] = {v.A.x, v.A.y, v.A.z, v.A.w}, bb[4] = {v.B.x, v.B.y, v.B.z, v.B.w},
                       hh[4] = {v.H.x, v.H.y, v.H.z, v.H.w};
        int q[4][4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            q[0][k] = int(__vsub4((a[k] & 0x0F0F0F0F) | ((hh[k] << 4) & 0x30303030), 0x20202020));
            q[1][k] = int(__vsub4((bb[k] & 0x0F0F0F0F) | ((hh[k] << 2) & 0x30303030), 0x20202020));
            q[2][k] = int(__vsub4(((a[k] >> 4) & 0x0F0F0F0F) | (hh[k] & 0x30303030), 0x20202020));
            q[3][k] = int(__vsub4(((bb[k] >> 4) & 0x0F0F0F0F) | ((hh[k] >> 2) & 0x30303030), 0x20202020));
        }
        const int is = h * 8 + (l0 >> 4);
        float sc[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) sc[k] = d * float(int8_t(byte_of(v.S.x, v.S.y, v.S.z, v.S.w, is + 2 * k)));
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
    static constexpr int kPer = 16 / sizeof(T);
    static constexpr int kDepth = 4;
    struct Data { uint4 q; };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        return {ld_stream(p.w + (row * p.n_in + int64_t(u) * kPer) * sizeof(T))};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        float wf[8];
        if constexpr (sizeof(T) == 4) {
            wf[0] = __uint_as_float(v.q.x); wf[1] = __uint_as_float(v.q.y);
            wf[2] = __uint_as_float(v.q.z); wf[3] = __uint_as_float(v.q.w);
        } else {
            const uint32_t qq[4] = {v.q.x, v.q.y, v.q.z, v.q.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                float2 f;
                if constexpr (std::is_same<T, __half>::value)
                    f = __half22float2(*reinterpret_cast<const __half2*>(&qq[k]));
                else
                    f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qq[k]));
                wf[2 * k] = f.x;
                wf[2 * k + 1] = f.y;
            }
        }
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
