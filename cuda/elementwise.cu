// Elementwise ops on float activations: gated activations (SiLU, GeLU), residual add, bias add,
// scale and soft-cap, and the KV store (float K/V rows -> f16 cache slots addressed through the block table).
#include "common.cuh"
#include "dq_order.cuh"
#include "gated_act.cuh"
#include "kernels.h"
#include "kv_store_rows.cuh"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

unsigned grid_for(int64_t n) {
    const int64_t g = (n + 255) / 256;
    return unsigned(g < 65536 ? (g > 0 ? g : 1) : 65536);
}

// out may alias gate or up: each element is read before it is written, by the same thread.
template <Activation A>
__global__ void gated_act_kernel(const float* g, const float* u, int64_t n, float* o) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        o[i] = gated<A>(g[i], u[i]);
}

// gated_act whose output also goes out as q8_1 blocks (n % 32 == 0), one warp per block.
template <Activation A>
__global__ void gated_act_q8_kernel(const float* g, const float* u, int64_t n_blocks, float* o, int8_t* __restrict__ q,
                                    float2* __restrict__ ds) {
    pdl_wait();
    pdl_trigger();
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / kWarp) + (threadIdx.x >> 5);
    if (blk >= n_blocks) return;
    const int lane = threadIdx.x & 31;
    const int64_t i = blk * 32 + lane;
    const float v = gated<A>(g[i], u[i]);
    o[i] = v;
    q8_1_block(v, lane, q + blk * 32, ds + blk);
}

// gated_act into gemm_dq's f16 order, four elements a thread.
template <Activation A>
__global__ void gated_act_dq_kernel(const float4* __restrict__ g, const float4* __restrict__ u, int64_t n4,
                                    __half* xh) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
        const float4 a = g[i], b = u[i];
        store_dq4(xh, 4 * i,
                  make_float4(gated<A>(a.x, b.x), gated<A>(a.y, b.y), gated<A>(a.z, b.z), gated<A>(a.w, b.w)));
    }
}

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] += y[i];
}

// Copy blockIdx.y of c. The host rewrites the source between launches: __ldcv reads it again
// rather than from a cache. The step's inputs it writes (positions, block tables) are fenced
// before the trigger, so every later kernel, which starts only after this one's CTAs have all
// triggered, may read them before its own wait (attention_short does).
__global__ void copy_from_pinned_kernel(HostCopies c) {
    pdl_wait();
    const int i = blockIdx.y;
    char* d = static_cast<char*>(c.dst[i]);
    const char* src = static_cast<const char*>(c.src[i]);
    const size_t n = c.bytes[i], first = size_t(blockIdx.x) * blockDim.x + threadIdx.x,
                 stride = size_t(gridDim.x) * blockDim.x;
    size_t tail = 0;
    if ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(src)) % 16 == 0) {
        for (size_t k = first; k < n / 16; k += stride)
            reinterpret_cast<uint4*>(d)[k] = __ldcv(reinterpret_cast<const uint4*>(src) + k);
        tail = n / 16 * 16;
    }
    for (size_t k = tail + first; k < n; k += stride) d[k] = __ldcv(reinterpret_cast<const signed char*>(src) + k);
    __threadfence();
    pdl_trigger();
}

__global__ void add_bias_kernel(float* __restrict__ x, const float* __restrict__ b, int64_t n, int32_t dim) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] += b[i % dim];
}

__global__ void scale_softcap_kernel(float* x, int64_t n, float scale, float cap) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = __fmul_rn(x[i], scale);
        x[i] = cap > 0.f ? __fmul_rn(cap, tanhf(__fdiv_rn(v, cap))) : v;
    }
}

__global__ void mul_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] = __fmul_rn(x[i], y[i]);
}

__global__ void softplus_gate_kernel(float* __restrict__ x, const float* __restrict__ bias,
                                     const float* __restrict__ scale, int64_t n, int32_t dim) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int32_t j = int32_t(i % dim);
        const float v = __fadd_rn(x[i], bias[j]);
        x[i] = __fmul_rn(scale[j], v > 20.f ? v : log1pf(expf_glibc(v)));
    }
}

struct ToHalf {
    __device__ __half operator()(float x) const { return __float2half_rn(x); }
};

}  // namespace

void gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out, cudaStream_t s) {
    if (n <= 0) return;
    with_activation(
        act, [&](auto a) { launch_pdl(gated_act_kernel<decltype(a)::value>, grid_for(n), 256, s, gate, up, n, out); });
    EMBER_CUDA_LAUNCHED("gated_act");
}

void gated_act_q8(Activation act, const float* gate, const float* up, int64_t n, float* out, int8_t* q, float2* ds,
                  cudaStream_t s) {
    if (n % 32) fail("cuda gated_act_q8: ", n, " elements are not whole 32-element blocks");
    const int64_t nb = n / 32;
    if (nb == 0) return;
    const unsigned grid = unsigned((nb + 7) / 8);
    with_activation(act, [&](auto a) {
        launch_pdl(gated_act_q8_kernel<decltype(a)::value>, grid, 256, s, gate, up, nb, out, q, ds);
    });
    EMBER_CUDA_LAUNCHED("gated_act_q8");
}

void gated_act_dq(Activation act, const float* gate, const float* up, int64_t n, __half* xh, cudaStream_t s) {
    if (n % 32) fail("cuda gated_act_dq: ", n, " elements are not whole 32-element blocks");
    if (n <= 0) return;
    const int64_t n4 = n / 4;
    const auto* g = reinterpret_cast<const float4*>(gate);
    const auto* u = reinterpret_cast<const float4*>(up);
    with_activation(
        act, [&](auto a) { launch_pdl(gated_act_dq_kernel<decltype(a)::value>, grid_for(n4), 256, s, g, u, n4, xh); });
    EMBER_CUDA_LAUNCHED("gated_act_dq");
}

void add(float* x, const float* y, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    launch_pdl(add_kernel, grid_for(n), 256, s, x, y, n);
    EMBER_CUDA_LAUNCHED("add");
}

void copy_from_pinned(const HostCopies& c, cudaStream_t s) {
    if (c.n <= 0) return;
    if (c.n > kMaxHostCopies) fail("cuda copy_from_pinned: ", c.n, " copies, at most ", kMaxHostCopies);
    launch_pdl(copy_from_pinned_kernel, dim3(8, unsigned(c.n)), 256, s, c);
    EMBER_CUDA_LAUNCHED("copy_from_pinned");
}

void add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim, cudaStream_t s) {
    const int64_t n = int64_t(n_tok) * dim;
    if (n <= 0) return;
    launch_pdl(add_bias_kernel, grid_for(n), 256, s, x, bias, n, dim);
    EMBER_CUDA_LAUNCHED("add_bias");
}

void scale_softcap(float* x, int64_t n, float scale, float cap, cudaStream_t s) {
    if (n <= 0) return;
    launch_pdl(scale_softcap_kernel, grid_for(n), 256, s, x, n, scale, cap);
    EMBER_CUDA_LAUNCHED("scale_softcap");
}

void mul(float* x, const float* y, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    launch_pdl(mul_kernel, grid_for(n), 256, s, x, y, n);
    EMBER_CUDA_LAUNCHED("mul");
}

void softplus_gate(float* x, const float* bias, const float* scale, int32_t n_tok, int32_t dim, cudaStream_t s) {
    const int64_t n = int64_t(n_tok) * dim;
    if (n <= 0) return;
    launch_pdl(softplus_gate_kernel, grid_for(n), 256, s, x, bias, scale, n, dim);
    EMBER_CUDA_LAUNCHED("softplus_gate");
}

void kv_store(__half* k_cache, __half* v_cache, int32_t block_size, int32_t kv_dim, const float* k, const float* v,
              int32_t n_tok, const DeviceBatch& b, cudaStream_t s) {
    if (n_tok <= 0) return;
    launch_pdl(kv_store_rows_kernel<__half, ToHalf>, unsigned(n_tok), 128, s, k_cache, v_cache, block_size, kv_dim, k,
               v, b);
    EMBER_CUDA_LAUNCHED("kv_store");
}

}  // namespace cuda
}  // namespace ember
