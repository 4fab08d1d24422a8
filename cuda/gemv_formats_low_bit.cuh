// The decode GEMV's formats of the ternary, 1-bit and NVFP4 types (block_decode_low_bit.cuh), as the
// other formats of gemv_formats.cuh: a unit's weight bytes loaded, then its integer dots with dp4a
// against the q8_1 activation blocks it covers. Included at the end of gemv_formats.cuh.
#pragma once
#include "gemv_formats.cuh"

namespace ember {
namespace cuda {

// TQ2_0: a unit is 32 quant bytes, half c of a block: 128 values, activation blocks 8 b + 4 c + s
// for the codes at shift 2 s.
struct FmtTQ2_0 {
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint4 a, b;
        uint16_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t blk = row * p.n_blocks + (u >> 1);
        const uint8_t* q = p.w + blk * DecodeTQ2_0::kQuantBytes + 32 * (u & 1);
        return Data{ld_stream(q), ld_stream(q + 16), __ldg(reinterpret_cast<const uint16_t*>(p.meta) + blk)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const uint32_t words[8] = {v.a.x, v.a.y, v.a.z, v.a.w, v.b.x, v.b.y, v.b.z, v.b.w};
        const float d = h2f(v.meta);
        const int64_t x0 = int64_t(u >> 1) * 8 + 4 * (u & 1);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            int w[8];
#pragma unroll
            for (int g = 0; g < 8; ++g) w[g] = tq2_values(words[g], s);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                int4 a, c;
                load_x32(p, t, x0 + s, a, c);
                acc[t] += d * load_ds(p, t, x0 + s).x * float(dot32(w, a, c));
            }
        }
    }
};

// TQ1_0: a unit is a whole block (its 52 quant bytes in four 16-byte loads) against its 8 activation
// blocks: digits 0-4 of qs[0..31] are blocks 0-4; digits 0-4 of qs[32..47] (16 values each) and qh's
// four digits fill blocks 5-7.
struct FmtTQ1_0 {
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 2;
    struct Data {
        uint4 q[4];
        uint16_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t blk = row * p.n_blocks + u;
        const uint8_t* q = p.w + blk * DecodeTQ1_0::kQuantBytes;
        Data v;
#pragma unroll
        for (int c = 0; c < 4; ++c) v.q[c] = ld_stream(q + 16 * c);
        v.meta = __ldg(reinterpret_cast<const uint16_t*>(p.meta) + blk);
        return v;
    }
    template <int NT>
    __device__ static void dot_block(const GemvParams& p, int64_t xb, const int (&w)[8], float d, float* acc) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, xb, a, c);
            acc[t] += d * load_ds(p, t, xb).x * float(dot32(w, a, c));
        }
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const float d = h2f(v.meta);
        const int64_t x0 = int64_t(u) * 8;
        uint32_t a[8] = {v.q[0].x, v.q[0].y, v.q[0].z, v.q[0].w, v.q[1].x, v.q[1].y, v.q[1].z, v.q[1].w};
        uint32_t b[4] = {v.q[2].x, v.q[2].y, v.q[2].z, v.q[2].w}, h = v.q[3].x;
        int w[8];
#pragma unroll
        for (int k = 0; k < 5; ++k) {
#pragma unroll
            for (int g = 0; g < 8; ++g) {
                w[g] = ternary4(a[g]);
                a[g] = times3_4(a[g]);
            }
            dot_block<NT>(p, x0 + k, w, d, acc);
        }
        // blocks 5, 6: two digits of qs[32..47] each; block 7: its digit 4, then qh's digits 0-3
#pragma unroll
        for (int k = 0; k < 2; ++k) {
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
                for (int g = 0; g < 4; ++g) {
                    w[4 * half + g] = ternary4(b[g]);
                    b[g] = times3_4(b[g]);
                }
            dot_block<NT>(p, x0 + 5 + k, w, d, acc);
        }
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            w[g] = ternary4(b[g]);
            w[4 + g] = ternary4(h);
            h = times3_4(h);
        }
        dot_block<NT>(p, x0 + 7, w, d, acc);
    }
};

// IQ1_S: a unit is a sub-block of 32 (its qs word and qh half-word) against activation block u.
struct FmtIQ1_S {
    using D = DecodeIQ1_S;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint32_t qs, qh;
        uint16_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t blk = row * p.n_blocks + (u >> 3);
        const uint8_t* base = p.w + blk * D::kQuantBytes;
        Data v;
        v.qs = __ldg(reinterpret_cast<const uint32_t*>(base) + (u & 7));
        v.qh = __ldg(reinterpret_cast<const uint16_t*>(base + D::kQh) + (u & 7));
        v.meta = __ldg(reinterpret_cast<const uint16_t*>(p.meta) + blk);
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const uint32_t sh = iq1_shift(v.qh & 0x8000);
        int w[8];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t pt = D::point(v.qs, v.qh, l);
            w[2 * l] = iq1_word(pt, 0, sh);
            w[2 * l + 1] = iq1_word(pt, 1, sh);
        }
        const float d = D::d(v.meta) * float(D::scale(v.qh));
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            acc[t] += d * load_ds(p, t, u).x * float(dot32(w, a, c));
        }
    }
};

// IQ1_M: a unit is a sub-block of 32 (qs word, two qh bytes, the block's scale words); its halves of
// 16 have their own scales.
struct FmtIQ1_M {
    using D = DecodeIQ1_M;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint32_t qs, qh;
        uint2 sc;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const uint8_t* base = p.w + (row * p.n_blocks + (u >> 3)) * D::kQuantBytes;
        Data v;
        v.qs = __ldg(reinterpret_cast<const uint32_t*>(base) + (u & 7));
        v.qh = __ldg(reinterpret_cast<const uint16_t*>(base + D::kQh) + (u & 7));
        v.sc = __ldg(reinterpret_cast<const uint2*>(base + D::kScales));
        return v;
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const int j = u & 7;
        int w[8];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t pt = D::point(v.qs, v.qh, l), sh = D::shift(v.qh, l);
            w[2 * l] = iq1_word(pt, 0, sh);
            w[2 * l + 1] = iq1_word(pt, 1, sh);
        }
        const int s0 = D::scale(v.sc, j, 0), s1 = D::scale(v.sc, j, 1);
        const float d = D::d(v.sc);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            const int lo = dot16(w[0], w[1], w[2], w[3], a), hi = dot16(w[4], w[5], w[6], w[7], c);
            acc[t] += d * load_ds(p, t, u).x * float(s0 * lo + s1 * hi);
        }
    }
};

// NVFP4: a unit is half a block (two sub-blocks of 16, 16 quant bytes) against activation block u;
// each sub-block with its own e4m3 scale.
struct FmtNVFP4 {
    using D = DecodeNVFP4;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint4 q;
        uint32_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t blk = row * p.n_blocks + (u >> 1);
        return Data{ld_stream(p.w + blk * D::kQuantBytes + 16 * (u & 1)),
                    __ldg(reinterpret_cast<const uint32_t*>(p.meta) + blk)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        int w[8];
#pragma unroll
        for (int g = 0; g < 8; ++g) w[g] = D::values(v.q, g);
        const float d0 = D::d(v.meta, 2 * (u & 1)), d1 = D::d(v.meta, 2 * (u & 1) + 1);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, u, a, c);
            const int lo = dot16(w[0], w[1], w[2], w[3], a), hi = dot16(w[4], w[5], w[6], w[7], c);
            acc[t] += load_ds(p, t, u).x * (d0 * float(lo) + d1 * float(hi));
        }
    }
};

}  // namespace cuda
}  // namespace ember
