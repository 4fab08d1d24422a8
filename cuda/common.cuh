// Device helpers shared by the CUDA kernels: warp reductions, 16-byte streaming loads that
// bypass L1, dp4a, and bit tricks for unpacking 5-bit quants.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/expf_table.h"
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

// Asks for the 128-byte line holding p (a global address) in L2; nothing is written.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Lets the next kernel of the stream start its CTAs as this grid's last ones run (they stop at
// pdl_wait until this grid has finished); every launch_pdl kernel calls it once it has started.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A rope pair (x0, x1) rotated by (cos, sin) = cs with the CPU backend's arithmetic: products
// rounded before the sum (no FMA contraction).
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float2 cs) {
    return make_float2(__fsub_rn(__fmul_rn(x0, cs.x), __fmul_rn(x1, cs.y)),
                       __fadd_rn(__fmul_rn(x0, cs.y), __fmul_rn(x1, cs.x)));
}

// expf as glibc (2.28 and later) computes it on x86-64 with FMA, which the CPU backend's softmax
// and swiglu call: x / ln2 = (k + r) / 32, exp(x) = 2^(k/32) * p(r) with a table of 2^(i/32) and a
// cubic in double. Over every float in [-110, 95] it differs from glibc 2.36's expf in 2 of
// 2.26e9 inputs (the double exp rounded to float differs in 6.3e-4 of them, CUDA's expf more
// often), and one ulp can flip a later f16 or int8 rounding away from the CPU's.
__device__ const uint64_t kExp2Table[32] = EMBER_EXPF_TABLE;   // bits of 2^(i/32) minus i << 47
__device__ __forceinline__ float expf_glibc(float x) {
    if (x != x) return x + x;
    if (x > kExpfOverflow) return INFINITY;
    if (x < kExpfUnderflow) return 0.f;
    const double z = __dmul_rn(kExpfInvLn2N, double(x));
    const double kd_shifted = __dadd_rn(z, kExpfShift);   // rounds z to an integer k in the low bits
    const uint64_t ki = uint64_t(__double_as_longlong(kd_shifted));
    const double r = __dsub_rn(z, __dsub_rn(kd_shifted, kExpfShift));
    const double s = __longlong_as_double((long long)(kExp2Table[ki % 32] + (ki << 47)));
    const double p = __fma_rn(__fma_rn(kExpfC0, r, kExpfC1), __dmul_rn(r, r), __fma_rn(kExpfC2, r, 1.0));
    return float(__dmul_rn(p, s));
}

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

// q8 activation rounding as the CPU backend's quantize_row_q8_0 / _q8_1 (ggml's scalar
// reference): d = amax / 127, q = round-half-away(x * (1 / d)); fp16 scales. With the same bytes
// the integer dots are equal, so the GEMV can round as the CPU does (gemv_legacy.cuh).
struct Q8Scale {
    float d, id;
};
__device__ __forceinline__ Q8Scale q8_scale(float amax) {
    const float d = __fdiv_rn(amax, 127.f);
    return {d, d != 0.f ? __frcp_rn(d) : 0.f};
}
__device__ __forceinline__ int q8_round(float x, float id) { return int(roundf(__fmul_rn(x, id))); }
__device__ __forceinline__ float2 q8_1_ds(float d, int sum) {
    return make_float2(__half2float(__float2half_rn(d)), __half2float(__float2half_rn(__fmul_rn(float(sum), d))));
}

// The 8 f16 values of a 16-byte word as floats.
__device__ __forceinline__ void unpack8(uint4 r, float* f) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
        f[2 * j] = v.x;
        f[2 * j + 1] = v.y;
    }
}

// Quantizes one 32-value block held one value per lane of a warp to q8_1 (q: the block's 32
// int8, ds: its (d, d * sum q)).
__device__ __forceinline__ void q8_1_block(float v, int lane, int8_t* q, float2* ds) {
    const Q8Scale sc = q8_scale(warp_max(fabsf(v)));
    const int qi = q8_round(v, sc.id);
    q[lane] = int8_t(qi);
    const int sum = warp_sum_int(qi);
    if (lane == 0) *ds = q8_1_ds(sc.d, sum);
}

}  // namespace cuda
}  // namespace ember
