// Activation conversions before a matmul: float -> q8_1 blocks for the integer GEMVs, and
// float -> f16 / bf16 for the cuBLAS tensor-core path.
#include "common.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

// One warp per 32-element block.
__global__ void quantize_q8_1_kernel(const float* __restrict__ x, int8_t* __restrict__ q, float2* __restrict__ ds,
                                     int64_t n_blocks) {
    pdl_wait();
    pdl_trigger();
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / kWarp) + (threadIdx.x >> 5);
    if (blk >= n_blocks) return;
    const int lane = threadIdx.x & 31;
    q8_1_block(x[blk * 32 + lane], lane, q + blk * 32, ds + blk);
}

template <class T>
__global__ void convert_kernel(const float* __restrict__ x, T* __restrict__ y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        if constexpr (std::is_same<T, __half>::value) y[i] = __float2half_rn(x[i]);
        else y[i] = __float2bfloat16_rn(x[i]);
    }
}

unsigned grid_for(int64_t n, int threads) {
    const int64_t g = (n + threads - 1) / threads;
    return unsigned(g < 65536 ? (g > 0 ? g : 1) : 65536);
}

}  // namespace

void quantize_q8_1(const float* x, int8_t* q, float2* ds, int32_t n_tok, int64_t n, cudaStream_t s) {
    if (n % 32) fail("cuda quantize_q8_1: width ", n, " is not a multiple of 32");
    const int64_t n_blocks = int64_t(n_tok) * n / 32;
    launch_pdl(quantize_q8_1_kernel, unsigned((n_blocks + 7) / 8), 256, s, x, q, ds, n_blocks);
    EMBER_CUDA_LAUNCHED("quantize_q8_1");
}

void convert_to_f16(const float* x, __half* y, int64_t n, cudaStream_t s) {
    convert_kernel<__half><<<grid_for(n, 256), 256, 0, s>>>(x, y, n);
    EMBER_CUDA_LAUNCHED("convert_to_f16");
}

void convert_to_bf16(const float* x, __nv_bfloat16* y, int64_t n, cudaStream_t s) {
    convert_kernel<__nv_bfloat16><<<grid_for(n, 256), 256, 0, s>>>(x, y, n);
    EMBER_CUDA_LAUNCHED("convert_to_bf16");
}

}  // namespace cuda
}  // namespace ember
