// gemm_dq's K order of f16 activations (gemm_dq.cu explains it): within each 32-element block,
// 16-byte chunk t holds elements 4t, 4t+2, 4t+1, 4t+3, 4t+16, 4t+18, 4t+17, 4t+19. Kernels that
// produce a matmul's input (rmsnorm, the gated activation, gemm_dq_input) write it in that order
// with store_dq4, so gemm_dq reads its B fragments as whole chunks.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "mma.cuh"

namespace ember {
namespace cuda {

// Elements e..e+3 (e % 4 == 0, index into a row-major array whose rows are whole 32-element
// blocks) as f16 into xh in gemm_dq's order: one 8-byte store.
__device__ __forceinline__ void store_dq4(__half* xh, int64_t e, float4 v) {
    const int j = int(e & 31) >> 2;   // which group of 4 in the block: chunk j & 3, half j >> 2
    __half* at = xh + (e & ~int64_t(31)) + 8 * (j & 3) + 4 * (j >> 2);
    *reinterpret_cast<uint2*>(at) = make_uint2(pack_half2(v.x, v.z), pack_half2(v.y, v.w));
}

}  // namespace cuda
}  // namespace ember
