// Flash-attention bookkeeping shared by the attention kernels: scores live in the log2 domain
// (scaled by log2 e, so exp2 gives the softmax); what a decode CTA covers; the online-softmax
// step of an mma fragment's rows; and a key range split over several CTAs, merged by the last
// CTA of its group to finish from the partials the others wrote.
#pragma once
#include "common.cuh"
#include "kernels.h"

namespace ember {
namespace cuda {

constexpr float kLog2e = 1.4426950408889634f;

// A decode CTA of the grid n_tok x (kv heads x groups of `rows` q heads) x n_split: token t, q
// heads h0 .. h0 + n_rows - 1 of kv head kvh, keys [k0, k1) in n_tiles tiles of `tile` keys (a
// split's range is a whole number of tiles). The visible keys are [lo, len): with a sliding
// window the tiles wholly below lo are skipped, and the kernel masks the keys below lo in the
// first one.
struct DecodeCta {
    int t, split, kvh, h0, n_rows, len, lo, k0, k1, n_tiles;
};
__device__ __forceinline__ DecodeCta decode_cta(const AttentionArgs& a, const DeviceBatch& b, int rows, int tile) {
    DecodeCta c;
    c.t = blockIdx.x;
    c.split = blockIdx.z;
    const int n_rep = a.n_head / a.n_head_kv, n_hchunks = (n_rep + rows - 1) / rows;
    c.kvh = blockIdx.y / n_hchunks;
    c.h0 = c.kvh * n_rep + (blockIdx.y % n_hchunks) * rows;
    c.n_rows = min(rows, c.kvh * n_rep + n_rep - c.h0);
    c.len = b.pos[c.t] + 1;
    c.lo = attention_first_key(a, c.len - 1);
    const int first = c.lo / tile * tile;
    const int chunk = ((c.len - first + a.n_split - 1) / a.n_split + tile - 1) / tile * tile;
    c.k0 = first + c.split * chunk;
    c.k1 = min(c.len, c.k0 + chunk);
    c.n_tiles = c.k1 > c.k0 ? (c.k1 - c.k0 + tile - 1) / tile : 0;
    return c;
}

// One online-softmax step for the rows g and g + 8 of an m16n8 mma fragment (a row lives in one
// lane quad): mx holds this lane's maxima of the two rows over the new scores. Updates the
// running maxima m, rescales the running sums l and the output fragments o to them, and returns
// the bases to exponentiate the new scores against. A row with no visible key yet keeps
// m = -inf; its base is 0 so exp2 gives 0, not NaN.
template <int N>
__device__ __forceinline__ float2 softmax_step(float2 mx, float& m0, float& m1, float& l0, float& l1,
                                               float (&o)[N][4]) {
    mx.x = fmaxf(mx.x, __shfl_xor_sync(0xffffffffu, mx.x, 1));
    mx.x = fmaxf(mx.x, __shfl_xor_sync(0xffffffffu, mx.x, 2));
    mx.y = fmaxf(mx.y, __shfl_xor_sync(0xffffffffu, mx.y, 1));
    mx.y = fmaxf(mx.y, __shfl_xor_sync(0xffffffffu, mx.y, 2));
    const float mn0 = fmaxf(m0, mx.x), mn1 = fmaxf(m1, mx.y);
    const float base0 = mn0 == -INFINITY ? 0.f : mn0, base1 = mn1 == -INFINITY ? 0.f : mn1;
    const float corr0 = exp2f(m0 - base0), corr1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    l0 *= corr0;
    l1 *= corr1;
    if (__any_sync(0xffffffffu, corr0 != 1.f || corr1 != 1.f)) {   // (past the first keys the maxima rarely move)
#pragma unroll
        for (int j = 0; j < N; ++j) {
            o[j][0] *= corr0;
            o[j][1] *= corr0;
            o[j][2] *= corr1;
            o[j][3] *= corr1;
        }
    }
    return make_float2(base0, base1);
}

// A log2-domain score soft-capped (AttentionShape::softcap): cap * tanh(s / cap) in the natural
// domain is c * tanh(s / c) with c = cap * log2 e in this one.
__device__ __forceinline__ float softcap_log2(const AttentionArgs& a, float s) {
    if (a.softcap <= 0.f) return s;
    const float c = a.softcap * kLog2e;
    return c * tanhf(s / c);
}

// What head h's sink logit (AttentionShape::sinks) adds to its softmax denominator, whose terms are
// exp2 of the log2-domain scores less m: each kernel adds it once, where it divides by the sum.
// An overflow to inf is the sink taking all the mass (the output goes to 0, as it should).
__device__ __forceinline__ float sink_term(const AttentionArgs& a, int64_t h, float m) {
    return a.sinks ? exp2f(a.sinks[h] * kLog2e - m) : 0.f;
}

// Output element e (token * n_head * head_dim + head * head_dim + dim) of the attention; where the
// O projection's GEMV reads q8_1 activations (a.out_q), also its q8_1 block, so no quantize
// launch follows. The calling warp's 32 lanes hold one block, lane i its element i (head_dim is a
// multiple of 32 wherever out_q is set).
__device__ __forceinline__ void store_out(const AttentionArgs& a, int64_t e, float v) {
    a.out[e] = v;
    if (a.out_q) q8_1_block(v, threadIdx.x & (kWarp - 1), a.out_q + (e & ~int64_t(31)), a.out_ds + e / 32);
}

// Split launches: every CTA of a (blockIdx.x, blockIdx.y) group writes its partial result, then
// the last one to finish merges them (no second launch). True, in all its threads, for that last
// CTA, which also resets the group's counter for the next launch or graph replay.
__device__ __forceinline__ bool last_of_splits(const AttentionArgs& a) {
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int* ctr = a.split_counter + blockIdx.x * gridDim.y + blockIdx.y;
        is_last = atomicAdd(ctr, 1) == a.n_split - 1;
        if (is_last) *ctr = 0;
    }
    __syncthreads();
    if (is_last) __threadfence();
    return is_last;
}

// Output element d of query slot th (token * n_head + head) from the splits' partials.
__device__ __forceinline__ float merge_splits(const AttentionArgs& a, int64_t th, int d) {
    const int64_t stride = int64_t(a.n_tok) * a.n_head;
    float mx = -INFINITY;
    for (int sp = 0; sp < a.n_split; ++sp) mx = fmaxf(mx, __ldcg(&a.part_ml[sp * stride + th]).x);
    float L = 0.f, o = 0.f;
#pragma unroll 8
    for (int sp = 0; sp < a.n_split; ++sp) {
        const float2 ml = __ldcg(&a.part_ml[sp * stride + th]);
        const float w = ml.x == -INFINITY ? 0.f : exp2f(ml.x - mx);
        L += ml.y * w;
        o += __ldcg(&a.part_acc[(sp * stride + th) * a.head_dim + d]) * w;
    }
    L += sink_term(a, th % a.n_head, mx);
    return L > 0.f ? o / L : 0.f;
}

}  // namespace cuda
}  // namespace ember
