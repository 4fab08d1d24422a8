// bf16 KV cache (layout: src/backend/kv_layout.h, rows as the f16 cache's): storing new K/V rows,
// and expanding the blocks a batch reads into the f16 copy every attention kernel reads. f16 holds
// a bf16 value exactly from 2^-14 to 65504 in magnitude; larger values saturate there (an inf
// would turn the softmax into NaN), smaller ones keep f16's subnormal steps.
#include <cuda_bf16.h>

#include "common.cuh"
#include "kernels.h"
#include "kv_store_rows.cuh"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

// Rounding to nearest even, as the CPU's float_to_bf16.
struct ToBf16 {
    __device__ __nv_bfloat16 operator()(float x) const { return __float2bfloat16_rn(x); }
};

constexpr int kExpandThreads = 256;
constexpr float kHalfMax = 65504.f;

// grid.x: (sequence, block index < n_blk) of the batch's block tables; grid.y: runs of
// kExpandThreads values of that block, for K and for V (either may be null).
__global__ void kv_expand_bf16_kernel(const __nv_bfloat16* __restrict__ kc, const __nv_bfloat16* __restrict__ vc,
                                      __half* __restrict__ kh, __half* __restrict__ vh, int32_t block_size,
                                      int32_t kv_dim, int32_t n_blocks, int32_t n_blk, DeviceBatch b) {
    pdl_wait();
    pdl_trigger();
    const int seq = blockIdx.x / n_blk, j = blockIdx.x % n_blk;
    const int32_t phys = b.block_table[int64_t(seq) * b.max_blocks + j];
    const int64_t n = int64_t(block_size) * kv_dim, i = int64_t(blockIdx.y) * kExpandThreads + threadIdx.x;
    if (phys < 0 || phys >= n_blocks || i >= n) return;
    const int64_t e = phys * n + i;
    if (kc) kh[e] = __float2half_rn(fminf(fmaxf(__bfloat162float(kc[e]), -kHalfMax), kHalfMax));
    if (vc) vh[e] = __float2half_rn(fminf(fmaxf(__bfloat162float(vc[e]), -kHalfMax), kHalfMax));
}

}  // namespace

void kv_store_bf16(uint16_t* k_cache, uint16_t* v_cache, int32_t block_size, int32_t kv_dim, const float* k,
                   const float* v, int32_t n_tok, const DeviceBatch& b, cudaStream_t s) {
    if (n_tok <= 0 || (!k_cache && !v_cache)) return;
    launch_pdl(kv_store_rows_kernel<__nv_bfloat16, ToBf16>, unsigned(n_tok), 128, s,
               reinterpret_cast<__nv_bfloat16*>(k_cache), reinterpret_cast<__nv_bfloat16*>(v_cache), block_size, kv_dim,
               k, v, b);
    EMBER_CUDA_LAUNCHED("kv_store_bf16");
}

void kv_expand_bf16(const uint16_t* k_cache, const uint16_t* v_cache, __half* k_f16, __half* v_f16, int32_t block_size,
                    int32_t kv_dim, int32_t n_blocks, int32_t n_seq, int32_t n_blk, const DeviceBatch& b,
                    cudaStream_t s) {
    if (n_seq <= 0 || n_blk <= 0 || (!k_cache && !v_cache)) return;
    const int64_t n = int64_t(block_size) * kv_dim;
    const dim3 grid(unsigned(n_seq * n_blk), unsigned((n + kExpandThreads - 1) / kExpandThreads));
    launch_pdl(kv_expand_bf16_kernel, grid, kExpandThreads, s, reinterpret_cast<const __nv_bfloat16*>(k_cache),
               reinterpret_cast<const __nv_bfloat16*>(v_cache), k_f16, v_f16, block_size, kv_dim, n_blocks, n_blk, b);
    EMBER_CUDA_LAUNCHED("kv_expand_bf16");
}

}  // namespace cuda
}  // namespace ember
