// Flash-decoding bookkeeping shared by the attention kernels: scores live in the log2 domain
// (scaled by log2 e, so exp2 gives the softmax), and a key range split over several CTAs is
// merged by the last CTA of its group to finish, from the partials the others wrote.
#pragma once
#include "common.cuh"
#include "kernels.h"

namespace ember {
namespace cuda {

constexpr float kLog2e = 1.4426950408889634f;

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
    return L > 0.f ? o / L : 0.f;
}

}  // namespace cuda
}  // namespace ember
