// Greedy choice on the device: each row's first highest logit (backend/greedy_token.h's rule, so the engine
// gets the ids the CPU sampler would pick), so a greedy decode step copies n_rows ids to the host
// instead of n_rows x n_vocab logits.
#include <climits>
#include <cstdint>

#include "common.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kThreads = 1024;

// (v, i) beats (bv, bi): a higher logit, or the same one earlier. NaN never wins (v > bv is
// false), and -inf never wins over the start value, so a row of only -inf / NaN keeps bi = INT_MAX.
__device__ __forceinline__ void take_better(float v, int i, float& bv, int& bi) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// One CTA per row. Each thread visits its values in ascending index order (the first of equal
// values stays), four at a time where rows are 16-byte aligned (kVec4): the row is read in a few
// wide loads per thread instead of a long chain of scalar ones.
template <bool kVec4>
__global__ void __launch_bounds__(kThreads)
    argmax_rows_kernel(const float* __restrict__ x, int64_t width, int32_t* __restrict__ ids) {
    pdl_wait();
    pdl_trigger();
    const float* row = x + int64_t(blockIdx.x) * width;
    float bv = -__int_as_float(0x7f800000);
    int bi = INT_MAX;
    if constexpr (kVec4) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        for (int64_t i = threadIdx.x; i < width / 4; i += kThreads) {
            const float4 v = row4[i];
            const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (e[j] > bv) {
                    bv = e[j];
                    bi = int(4 * i + j);
                }
        }
    } else {
        for (int64_t i = threadIdx.x; i < width; i += kThreads)
            if (row[i] > bv) {
                bv = row[i];
                bi = int(i);
            }
    }
    for (int o = 16; o > 0; o >>= 1)
        take_better(__shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o), bv, bi);
    __shared__ float sv[kThreads / 32];
    __shared__ int si[kThreads / 32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kThreads / 32; ++w) take_better(sv[w], si[w], bv, bi);
        ids[blockIdx.x] = bi == INT_MAX ? -1 : bi;
    }
}

}  // namespace

void argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids, cudaStream_t s) {
    if (n_rows <= 0) return;
    if (width <= 0 || width > INT_MAX) fail("cuda argmax_rows: row width ", width, " is out of range");
    if (width % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0)
        launch_pdl(argmax_rows_kernel<true>, unsigned(n_rows), kThreads, s, x, width, ids);
    else launch_pdl(argmax_rows_kernel<false>, unsigned(n_rows), kThreads, s, x, width, ids);
    EMBER_CUDA_LAUNCHED("argmax_rows");
}

}  // namespace cuda
}  // namespace ember
