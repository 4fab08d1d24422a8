// The decode GEMV's formats of Q2_K and Q3_K (block_decode_q2_q3.cuh), as the other formats of
// gemv_formats.cuh: a unit is 32 elements of a block (unit j: the codes of qs bytes 32 (j / 4) ..
// + 31 at shift 2 (j % 4), groups 2j and 2j + 1) against activation block 8 b + j, its integer dots
// with dp4a. Included at the end of gemv_formats.cuh.
#pragma once
#include "gemv_formats.cuh"

namespace ember {
namespace cuda {

struct FmtQ2_K {
    using D = DecodeQ2_K;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint4 sc, qa, qb;
        uint32_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 3);
        const uint8_t* base = p.w + b * D::kQuantBytes;
        const uint8_t* qs = base + D::kQs + 32 * ((u & 7) >> 2);
        return Data{ld_stream(base), ld_stream(qs), ld_stream(qs + 16),
                    __ldg(reinterpret_cast<const uint32_t*>(p.meta) + b)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const int j = u & 7, k = j & 3;
        const uint32_t q[8] = {v.qa.x, v.qa.y, v.qa.z, v.qa.w, v.qb.x, v.qb.y, v.qb.z, v.qb.w};
        int w[8];
#pragma unroll
        for (int x = 0; x < 8; ++x) w[x] = int(q2_codes(q[x], k));
        const uint32_t s0 = byte_of(v.sc.x, v.sc.y, v.sc.z, v.sc.w, 2 * j);
        const uint32_t s1 = byte_of(v.sc.x, v.sc.y, v.sc.z, v.sc.w, 2 * j + 1);
        const int sc0 = int(s0 & 0x0F), sc1 = int(s1 & 0x0F), mn0 = int(s0 >> 4), mn1 = int(s1 >> 4);
        const float d = D::d(v.meta), dmin = D::dmin(v.meta);
        const int ones = 0x01010101;
        const int64_t xb = int64_t(u >> 3) * 8 + j;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, xb, a, c);
            const int lo = dot16(w[0], w[1], w[2], w[3], a), hi = dot16(w[4], w[5], w[6], w[7], c);
            const int sum_lo = dot16(ones, ones, ones, ones, a), sum_hi = dot16(ones, ones, ones, ones, c);
            acc[t] += load_ds(p, t, xb).x *
                      (d * float(sc0 * lo + sc1 * hi) - dmin * float(mn0 * sum_lo + mn1 * sum_hi));
        }
    }
};

struct FmtQ3_K {
    using D = DecodeQ3_K;
    static constexpr bool kWholeRow = false;
    static constexpr int kDepth = 4;
    struct Data {
        uint4 ha, hb, qa, qb, sc;
        uint16_t meta;
    };
    __device__ static Data load(const GemvParams& p, int64_t row, int u) {
        const int64_t b = row * p.n_blocks + (u >> 3);
        const uint8_t* base = p.w + b * D::kQuantBytes;
        const uint8_t* qs = base + D::kQs + 32 * ((u & 7) >> 2);
        return Data{
            ld_stream(base),    ld_stream(base + 16),         ld_stream(qs),
            ld_stream(qs + 16), ld_stream(base + D::kScales), __ldg(reinterpret_cast<const uint16_t*>(p.meta) + b)};
    }
    template <int NT>
    __device__ static void dot(const GemvParams& p, int u, const Data& v, float* acc) {
        const int j = u & 7, k = j & 3;
        const uint32_t q[8] = {v.qa.x, v.qa.y, v.qa.z, v.qa.w, v.qb.x, v.qb.y, v.qb.z, v.qb.w};
        const uint32_t h[8] = {v.ha.x, v.ha.y, v.ha.z, v.ha.w, v.hb.x, v.hb.y, v.hb.z, v.hb.w};
        int w[8];
#pragma unroll
        for (int x = 0; x < 8; ++x) w[x] = D::values(q[x], h[x], k, j);
        const int s0 = D::scale(v.sc.x, v.sc.y, v.sc.z, 2 * j), s1 = D::scale(v.sc.x, v.sc.y, v.sc.z, 2 * j + 1);
        const float d = h2f(v.meta);
        const int64_t xb = int64_t(u >> 3) * 8 + j;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int4 a, c;
            load_x32(p, t, xb, a, c);
            const int lo = dot16(w[0], w[1], w[2], w[3], a), hi = dot16(w[4], w[5], w[6], w[7], c);
            acc[t] += d * load_ds(p, t, xb).x * float(s0 * lo + s1 * hi);
        }
    }
};

}  // namespace cuda
}  // namespace ember
