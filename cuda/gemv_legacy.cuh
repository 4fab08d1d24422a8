// Decode GEMV rows of the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against q8_1
// activations, summed in the CPU backend's AVX-512 order (src/cpu/vec_dot_avx512.cpp,
// dot_legacy) so that a GPU row has the CPU's bits on an AVX-512 host. Greedy decoding then
// follows the CPU backend token for token instead of drawing its own rounding lottery.
//
// The CPU order, for a row of nb blocks: 32 float accumulators, acc0 (lanes 0-15) and acc1
// (16-31). Blocks go four at a time (a "group"): block 4g + j feeds lanes 8j..8j+7, lane 8j + k
// taking the integer dot of elements 4k..4k+3, which it converts to float and adds as
// fma(isum, d_w * d_x, acc). A last pair of blocks (nb % 4 >= 2) goes to acc0 only. The lanes
// are then summed as a butterfly over lane distance 16, 8, 4, 2, 1. The *_1 formats add
// m_w * s_x per block into four running sums (one per j), joined as (j0 + j1) + (j2 + j3). A last
// odd block adds fma(d_w * d_x, isum, s), then fma(m_w, s_x, s).
//
// The price is instructions, about twice those of the lane-strided order of gemv_formats.cuh (a
// 7B Q4_0 model decodes at about half the rate this way: docs/performance.md), so rows up to
// kLegacyExactMaxWidth (SmolLM2's 576 and 1536, any model up to 2048 wide) take this order and
// wider rows the fast one.
//
// Here warp lane L is CPU lane L: each lane runs its own fma chain over the groups, so the
// float operations and their order are the CPU's. Each lane also loads the scales of some blocks
// and passes d_w * d_x (and m_w * s_x) to the lanes that need them.
//
// Q4_0, Q4_1 and Q8_0 rows are summed as the CPU's fast kernel sums them instead (AVX-512 takes it
// for every batch of those types, src/cpu/gemm_fast_avx512.cpp): one chain over the blocks in
// order, acc = fma(isum_b * d_w, d_x, acc), then for Q4_1 acc = fma(m_w, s_x, acc). The 8 lanes
// of a group add their integer dots into the block's (exact in any order), and every lane runs
// the whole chain, so all hold the row's result.
#pragma once
#include "gemv_formats.cuh"
#include "weight_pack.h"

namespace ember {
namespace cuda {

__device__ __forceinline__ uint32_t ld_stream32(const void* p) {
    uint32_t r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}

// The types summed in the CPU fast kernel's single chain (see the top of this file); the others
// take the per-lane chains. Each type is read through its decoder (block_decode.cuh): Meta,
// d(), m(), qh() and values() of group k for lane k.
template <class D>
constexpr bool kFastChain = D::kType == GGMLType::Q4_0 || D::kType == GGMLType::Q4_1 || D::kType == GGMLType::Q8_0;

// Offset of lane k's word in a block's quants: lane k takes group k (elements 4k..4k+3) as the
// block's decoder places it (block_decode.cuh), so for the nibble types lanes k and k + 4 read
// the same word (low and high nibbles) and for Q8_0 each lane its own.
template <class D>
__device__ __forceinline__ int word_offset(int k) {
    return 4 * D::word(k);
}

// An integer below 2^22 in magnitude as a float, exactly, without the quarter-rate I2F:
// 2^23 + 2^22 + i has i in its low mantissa bits.
__device__ __forceinline__ float small_int_to_float(int i) {
    return __fsub_rn(__int_as_float(0x4B400000 + i), 12582912.f);
}

// out[t] = row `row` of the weight . token t's activations, on every lane of the warp. A round
// has the loads of 32 * R blocks (weights, then activations) in flight at once: a 4096-wide row
// is one round at R = 4. Lane L holds the scales of blocks L, L + 32, ... of the round.
template <class F, int NT>
__device__ __forceinline__ void legacy_row_dot(const GemvParams& p, int64_t row, float (&out)[NT]) {
    constexpr int R = NT == 1 ? 4 : 1;   // more tokens keep more activations in registers
    constexpr int kGroups = 8 * R, kQB = F::kQuantBytes;
    const int lane = threadIdx.x & (kWarp - 1), k = lane & 7, j = lane >> 3;
    const int64_t nb = p.n_blocks, n_even = nb & ~int64_t(1), n_xb = p.n_in / 32;
    const uint8_t* quants = p.w + row * nb * kQB;
    const uint8_t* wlane = quants + j * kQB + word_offset<F>(k);   // the lane's word of group 0
    const int8_t* xlane = p.xq + j * 32 + 4 * k;
    const typename F::Meta* meta = reinterpret_cast<const typename F::Meta*>(p.meta) + row * nb;
    float acc[NT] = {}, accm[NT] = {};
    uint32_t words[kGroups];
    typename F::Meta own[R] = {};
    auto load = [&](int64_t b0) {
#pragma unroll
        for (int g = 0; g < kGroups; ++g)
            if (b0 + 4 * g + j < n_even) words[g] = ld_stream32(wlane + (b0 + 4 * g) * kQB);
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (b0 + 32 * r + lane < n_even) own[r] = meta[b0 + 32 * r + lane];
    };
    load(0);
    pdl_wait();   // weights above do not depend on the previous kernel; activations below do
    for (int64_t b0 = 0; b0 < n_even; b0 += 4 * kGroups) {
        int xw[kGroups][NT];
#pragma unroll
        for (int g = 0; g < kGroups; ++g)
#pragma unroll
            for (int t = 0; t < NT; ++t)
                if (b0 + 4 * g + j < n_even)
                    xw[g][t] = *reinterpret_cast<const int*>(xlane + t * p.n_in + (b0 + 4 * g) * 32);
        float2 xds[R][NT];   // d_x, s_x of the lane's blocks
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const int64_t b = b0 + 32 * r + lane;
                xds[r][t] = b < n_even ? p.xds[t * n_xb + b] : make_float2(0.f, 0.f);
            }
        if constexpr (kFastChain<F>) {
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                if (b0 + 4 * g >= n_even) break;   // warp-uniform
                const int r = g / 8;
                const int w = F::values(words[g], k, 0u);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    int isum = b0 + 4 * g + j < n_even ? dp4a(w, xw[g][t], 0) : 0;
#pragma unroll
                    for (int o = 4; o > 0; o >>= 1) isum += __shfl_xor_sync(0xffffffffu, isum, o);
#pragma unroll
                    for (int jj = 0; jj < 4; ++jj) {   // the group's blocks in order
                        const int src = (4 * g + jj) & (kWarp - 1);
                        const int bsum = __shfl_sync(0xffffffffu, isum, 8 * jj);
                        const float dw = __shfl_sync(0xffffffffu, F::d(own[r]), src);
                        const float dx = __shfl_sync(0xffffffffu, xds[r][t].x, src);
                        const float mw = F::kHasMin ? __shfl_sync(0xffffffffu, F::m(own[r]), src) : 0.f;
                        const float sx = F::kHasMin ? __shfl_sync(0xffffffffu, xds[r][t].y, src) : 0.f;
                        if (b0 + 4 * g + jj < n_even) {
                            acc[t] = __fmaf_rn(__fmul_rn(small_int_to_float(bsum), dw), dx, acc[t]);
                            if (F::kHasMin) acc[t] = __fmaf_rn(mw, sx, acc[t]);
                        }
                    }
                }
            }
        } else {
            float pd[R][NT], pm[R][NT];   // d_w * d_x and m_w * s_x of the lane's blocks
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    pd[r][t] = __fmul_rn(F::d(own[r]), xds[r][t].x);
                    pm[r][t] = F::kHasMin ? __fmul_rn(F::m(own[r]), xds[r][t].y) : 0.f;
                }
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                if (b0 + 4 * g >= n_even) break;   // warp-uniform
                const bool mine = b0 + 4 * g + j < n_even;
                const int src = (4 * g + j) & (kWarp - 1), r = g / 8;
                const uint32_t qh = F::kHighBits ? __shfl_sync(0xffffffffu, F::qh(own[r]), src) : 0u;
                const int w = F::values(words[g], k, qh);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    const float d = __shfl_sync(0xffffffffu, pd[r][t], src);
                    const float m = F::kHasMin ? __shfl_sync(0xffffffffu, pm[r][t], src) : 0.f;
                    if (mine) {
                        acc[t] = fmaf(small_int_to_float(dp4a(w, xw[g][t], 0)), d, acc[t]);
                        if (F::kHasMin) accm[t] = __fadd_rn(accm[t], m);
                    }
                }
            }
        }
        if (b0 + 4 * kGroups < n_even) load(b0 + 4 * kGroups);
    }
    const bool odd = nb & 1;
    int tail_w = 0;
    typename F::Meta tail_m{};
    if (odd) {
        tail_m = meta[nb - 1];
        tail_w = F::values(ld_stream32(quants + (nb - 1) * kQB + word_offset<F>(k)), k, F::qh(tail_m));
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if constexpr (kFastChain<F>) {   // every lane holds the chain; the last odd block continues it
            float s = acc[t];
            if (odd) {
                int isum = dp4a(tail_w, *reinterpret_cast<const int*>(p.xq + t * p.n_in + (nb - 1) * 32 + 4 * k), 0);
#pragma unroll
                for (int o = 4; o > 0; o >>= 1) isum += __shfl_xor_sync(0xffffffffu, isum, o);
                const float2 ds = p.xds[t * n_xb + nb - 1];
                s = __fmaf_rn(__fmul_rn(small_int_to_float(isum), F::d(tail_m)), ds.x, s);
                if (F::kHasMin) s = __fmaf_rn(F::m(tail_m), ds.y, s);
            }
            out[t] = s;
            continue;
        }
        float s = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
        if (F::kHasMin) {
            float m = __fadd_rn(accm[t], __shfl_xor_sync(0xffffffffu, accm[t], 8));
            s = __fadd_rn(s, __fadd_rn(m, __shfl_xor_sync(0xffffffffu, m, 16)));
        }
        if (odd) {   // every group of 8 lanes computes the block's whole integer dot
            int isum = dp4a(tail_w, *reinterpret_cast<const int*>(p.xq + t * p.n_in + (nb - 1) * 32 + 4 * k), 0);
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) isum += __shfl_xor_sync(0xffffffffu, isum, o);
            const float2 ds = p.xds[t * n_xb + nb - 1];
            s = fmaf(__fmul_rn(F::d(tail_m), ds.x), float(isum), s);
            if (F::kHasMin) s = fmaf(F::m(tail_m), ds.y, s);
        }
        out[t] = s;
    }
}

// The GEMV format of a 32-element block type's decoder (gemv.cu: one warp per row).
template <class F>
struct LegacyRows {
    static constexpr bool kWholeRow = true;
    template <int NT>
    __device__ static void row_dot(const GemvParams& p, int64_t row, float (&out)[NT]) {
        legacy_row_dot<F, NT>(p, row, out);
    }
};

}  // namespace cuda
}  // namespace ember
