// Device helpers shared by the CUDA kernels: warp reductions, 16-byte streaming loads that
// bypass L1, dp4a, and bit tricks for unpacking 5-bit quants.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda_check.h"

namespace ember {
namespace cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Weights are read exactly once per step: stream them past L1 so activations stay cached.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

// Bit k (k = 0..3) of the low nibble of n goes to bit 4 of byte k: the 5th bit of four
// consecutive Q5 quants. The multiply places n's bits 7 apart, so no carries collide.
__device__ __forceinline__ int spread4_bit4(uint32_t n) {
    return (int)((((n & 0xFu) * 0x00204081u) & 0x01010101u) << 4);
}

}  // namespace cuda
}  // namespace ember
