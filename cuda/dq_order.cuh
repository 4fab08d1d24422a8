// gemm_dq's K order of f16 activations (gemm_dq.cu explains it): each 16 elements of a 32-element
// block go as their evens, then their odds, so a block's four 16-byte chunks hold elements
// 0, 2, ..., 14 | 1, 3, ..., 15 | 16, 18, ..., 30 | 17, 19, ..., 31. Kernels that produce a
// matmul's input (rmsnorm, the gated activation, gemm_dq_input) write it in that order with
// store_dq4.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "mma.cuh"

namespace ember {
namespace cuda {

// Elements e..e+3 (e % 4 == 0, index into a row-major array whose rows are whole 32-element
// blocks) as f16 into xh in gemm_dq's order: e and e + 2 are neighbours among the evens, e + 1
// and e + 3 among the odds 8 halves later.
__device__ __forceinline__ void store_dq4(__half* xh, int64_t e, float4 v) {
    __half* at = xh + (e & ~int64_t(15)) + (int(e & 15) >> 1);
    *reinterpret_cast<uint32_t*>(at) = pack_half2(v.x, v.z);
    *reinterpret_cast<uint32_t*>(at + 8) = pack_half2(v.y, v.w);
}

}  // namespace cuda
}  // namespace ember
