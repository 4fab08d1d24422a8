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

// Programmatic dependent launch: wait until the previous kernel's results are visible. Every
// kernel started with launch_pdl calls this before its first access to activations.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel of the stream start its CTAs as this grid's last ones run (they stop at
// pdl_wait until this grid has finished); every launch_pdl kernel calls it once it has started.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A libm float function as the CPU backend gets it (expf, powf, sinf, cosf: within about half an
// ulp), from the double function rounded once. CUDA's float versions are 1-2 ulp off in a good
// share of cases, and one ulp can flip a later f16 or int8 rounding away from the CPU's.
__device__ __forceinline__ float libm_f(double v) { return float(v); }
__device__ __forceinline__ float exp_libm(float x) { return libm_f(exp(double(x))); }

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

// Weights are read exactly once per step: stream them past L1 so activations stay cached, and
// fetch whole 256-byte L2 sectors (the neighbours are read next).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
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

// Quantizes one 32-value block held one value per lane of a warp to q8_1 (q: the block's 32
// int8, ds: its (d, d * sum q)). Rounding as ggml's x86 quantize_row_q8_1 (x * (127 / amax),
// to nearest even; fp16 scales), so dot products round as the reference CPU ones do.
__device__ __forceinline__ void q8_1_block(float v, int lane, int8_t* q, float2* ds) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    const int qi = __float2int_rn(v * id);
    q[lane] = int8_t(qi);
    const int sum = warp_sum_int(qi);
    if (lane == 0) *ds = make_float2(__half2float(__float2half_rn(d)), __half2float(__float2half_rn(d * float(sum))));
}

}  // namespace cuda
}  // namespace ember
