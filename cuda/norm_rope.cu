// RMS norm (one block per token row) and rotary position embedding (one thread per rotated
// pair; normal mode rotates (2i, 2i+1), neox mode (i, i + head_dim/2)).
#include "common.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kNormThreads = 256;

// One block per token row. With `res`, first x += res (the residual add of the previous op,
// written back). With `q`, y is also quantized to q8_1 for the GEMV that reads it next.
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ res,
                                                              const float* __restrict__ gamma, int32_t dim, float eps,
                                                              float* __restrict__ y, int8_t* __restrict__ q,
                                                              float2* __restrict__ ds) {
    pdl_wait();
    float* xr = x + int64_t(blockIdx.x) * dim;
    float* yr = y + int64_t(blockIdx.x) * dim;
    float ss = 0.f;
    if (res) {
        const float* rr = res + int64_t(blockIdx.x) * dim;
        for (int i = threadIdx.x; i < dim; i += kNormThreads) {
            const float v = xr[i] + rr[i];
            xr[i] = v;
            ss += v * v;
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += kNormThreads) ss += xr[i] * xr[i];
    }
    __shared__ float red[kNormThreads / kWarp];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();   // also makes this block's writes of x visible to all its threads
    if (threadIdx.x < kWarp) {
        float v = threadIdx.x < kNormThreads / kWarp ? red[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    const float inv = rsqrtf(red[0] / float(dim) + eps);
    if (q) {   // dim % 32 == 0: each warp takes whole 32-element blocks
        const int lane = threadIdx.x & 31, nb = dim / 32;
        for (int blk = threadIdx.x >> 5; blk < nb; blk += kNormThreads / kWarp) {
            const int i = blk * 32 + lane;
            const float v = xr[i] * inv * gamma[i];
            yr[i] = v;
            q8_1_block(v, lane, q + int64_t(blockIdx.x) * dim + blk * 32, ds + int64_t(blockIdx.x) * nb + blk);
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += kNormThreads) yr[i] = xr[i] * inv * gamma[i];
    }
}

__global__ void rope_kernel(float* __restrict__ x, const int32_t* __restrict__ pos, int32_t n_tok, int32_t n_heads,
                            int32_t head_dim, float log2_base, bool neox) {
    pdl_wait();
    const int half = head_dim / 2;
    const int64_t total = int64_t(n_tok) * n_heads * half;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += int64_t(gridDim.x) * blockDim.x) {
        const int i = int(g % half);
        const int64_t th = g / half;   // token * n_heads + head
        const int t = int(th / n_heads);
        // theta = pos * base^(-2i/head_dim)
        const float theta = float(pos[t]) * exp2f(-log2_base * float(2 * i) / float(head_dim));
        float sn, cs;
        sincosf(theta, &sn, &cs);
        float* h = x + th * head_dim;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = h[a], x1 = h[b];
        h[a] = x0 * cs - x1 * sn;
        h[b] = x0 * sn + x1 * cs;
    }
}

}  // namespace

void rmsnorm(float* x, const float* res, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y,
             int8_t* q, float2* ds, cudaStream_t s) {
    if (n_tok <= 0) return;
    if (q && dim % 32) fail("cuda rmsnorm: q8 output needs a width that is a multiple of 32, got ", dim);
    launch_pdl(rmsnorm_kernel, unsigned(n_tok), kNormThreads, s, x, res, gamma, dim, eps, y, q, ds);
    EMBER_CUDA_LAUNCHED("rmsnorm");
}

void rope(float* x, const int32_t* pos, int32_t n_tok, int32_t n_heads, int32_t head_dim, float freq_base,
          bool neox, cudaStream_t s) {
    if (head_dim % 2) fail("cuda rope: head_dim ", head_dim, " is odd");
    const int64_t total = int64_t(n_tok) * n_heads * (head_dim / 2);
    if (total == 0) return;
    const unsigned grid = unsigned(std::min<int64_t>((total + 255) / 256, 65536));
    launch_pdl(rope_kernel, grid, 256, s, x, pos, n_tok, n_heads, head_dim, log2f(freq_base), neox);
    EMBER_CUDA_LAUNCHED("rope");
}

}  // namespace cuda
}  // namespace ember
