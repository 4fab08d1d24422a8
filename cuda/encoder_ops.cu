// The encoders' kernels: LayerNorm (one CTA a row), GELU / tanh, and bidirectional attention of
// packed sequences with no KV cache (one CTA a query token and head, online softmax per warp).
#include "common.cuh"
#include "encoder_kernels.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kNormThreads = 256;
constexpr int kAttnWarps = 4;

__device__ float block_sum(float v, float* shared) {
    v = warp_sum(v);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < int(blockDim.x / kWarp); ++w) total += shared[w];
    return total;
}

__global__ void layernorm_kernel(const float* x, const float* gamma, const float* beta, int32_t dim, float eps,
                                 float* y) {
    __shared__ float shared[kNormThreads / kWarp];
    const float* xr = x + int64_t(blockIdx.x) * dim;
    float* yr = y + int64_t(blockIdx.x) * dim;
    float s = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, shared) / dim;
    float q = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) q += (xr[i] - mean) * (xr[i] - mean);
    const float rstd = rsqrtf(block_sum(q, shared) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = (xr[i] - mean) * rstd * gamma[i];
        yr[i] = beta ? v + beta[i] : v;
    }
}

__global__ void unary_kernel(UnaryOp f, float* x, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = x[i];
        if (f == UnaryOp::GeLUErf) x[i] = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
        else if (f == UnaryOp::GeLUTanh)
            x[i] = 0.5f * v * (1.f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
        else if (f == UnaryOp::ReLUSquared) x[i] = v > 0.f ? v * v : 0.f;
        else x[i] = tanhf(v);
    }
}

// CTA (i, h): query token i, head h. Warp w takes keys first + w, first + w + kAttnWarps, ... of
// i's sequence with its own running max and sum; the warps' partial results merge at the end.
__global__ void encoder_attention_kernel(const float* q, const float* k, const float* v, int32_t n_tok, int32_t n_head,
                                         int32_t n_head_kv, int32_t head_dim, float scale, int32_t window,
                                         const int32_t* pos, const int32_t* seq, float* out) {
    constexpr int C = kEncoderMaxHeadDim / kWarp;
    __shared__ int32_t span[2];
    __shared__ float part_m[kAttnWarps], part_l[kAttnWarps];
    __shared__ float part_acc[kAttnWarps][kEncoderMaxHeadDim];
    const int32_t i = blockIdx.x, h = blockIdx.y, g = h / (n_head / n_head_kv);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (threadIdx.x == 0) {
        int32_t first = i, end = i + 1;
        while (first > 0 && seq[first - 1] == seq[i]) --first;
        while (end < n_tok && seq[end] == seq[i]) ++end;
        span[0] = first, span[1] = end;
    }
    __syncthreads();
    const int64_t qw = int64_t(n_head) * head_dim, kw = int64_t(n_head_kv) * head_dim;
    const float* qi = q + i * qw + int64_t(h) * head_dim;
    float qr[C], acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int d = lane + c * kWarp;
        qr[c] = d < head_dim ? qi[d] : 0.f;
        acc[c] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    const int32_t pi = pos[i];
    for (int32_t j = span[0] + warp; j < span[1]; j += kAttnWarps) {
        if (window > 0 && abs(pos[j] - pi) >= window) continue;
        const float* kj = k + j * kw + int64_t(g) * head_dim;
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int d = lane + c * kWarp;
            if (d < head_dim) s += qr[c] * kj[d];
        }
        s = warp_sum(s) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = __expf(m - m_new), p = __expf(s - m_new);
        l = l * corr + p;
        const float* vj = v + j * kw + int64_t(g) * head_dim;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int d = lane + c * kWarp;
            acc[c] = acc[c] * corr + (d < head_dim ? p * vj[d] : 0.f);
        }
        m = m_new;
    }
    if (lane == 0) part_m[warp] = m, part_l[warp] = l;
#pragma unroll
    for (int c = 0; c < C; ++c) part_acc[warp][lane + c * kWarp] = acc[c];
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, part_m[w]);
    float denom = 0.f;
    for (int w = 0; w < kAttnWarps; ++w)
        if (part_l[w] > 0.f) denom += part_l[w] * __expf(part_m[w] - mx);
    float* o = out + i * qw + int64_t(h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float sum = 0.f;
        for (int w = 0; w < kAttnWarps; ++w)
            if (part_l[w] > 0.f) sum += part_acc[w][d] * __expf(part_m[w] - mx);
        o[d] = sum / denom;
    }
}

}  // namespace

void layernorm(const float* x, const float* gamma, const float* beta, int32_t n_tok, int32_t dim, float eps, float* y,
               cudaStream_t s) {
    if (n_tok <= 0) return;
    layernorm_kernel<<<n_tok, kNormThreads, 0, s>>>(x, gamma, beta, dim, eps, y);
    EMBER_CUDA_CHECK(cudaGetLastError());
}

void unary(UnaryOp f, float* x, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    const int64_t blocks = (n + 255) / 256;
    unary_kernel<<<unsigned(blocks < 65536 ? blocks : 65536), 256, 0, s>>>(f, x, n);
    EMBER_CUDA_CHECK(cudaGetLastError());
}

void encoder_attention(const float* q, const float* k, const float* v, int32_t n_tok, int32_t n_head, int32_t n_head_kv,
                       int32_t head_dim, float scale, int32_t window, const DeviceBatch& b, float* out,
                       cudaStream_t s) {
    if (n_tok <= 0) return;
    encoder_attention_kernel<<<dim3(n_tok, n_head), kAttnWarps * kWarp, 0, s>>>(
        q, k, v, n_tok, n_head, n_head_kv, head_dim, scale, window, b.pos, b.seq, out);
    EMBER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda
}  // namespace ember
