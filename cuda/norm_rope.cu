// RMS norm (one block per token row, or one warp per head for the q/k head norms) and rotary
// position embedding (one thread per rotated pair; normal mode rotates (2i, 2i+1), neox mode
// (i, i + head_dim/2)).
#include "common.cuh"
#include "dq_order.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kNormThreads = 256;

// The CPU backend's (and ggml's) arithmetic: squares summed in double, then
// 1 / sqrt(float(mean) + eps) correctly rounded, so a norm's q8 output rounds as the CPU's does.
__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float rms_scale(double sum_sq, int32_t dim, float eps) {
    return __fdiv_rn(1.0f, __fsqrt_rn(float(sum_sq / dim) + eps));
}

// One block per token row. With `res`, first x += res (the residual add of the previous op,
// written back). With `q`, y is also quantized to q8_1 for the GEMV that reads it next. y may be
// x (Gemma 3's post-norms): each element is read before the same thread writes it.
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(float* x, const float* __restrict__ res, const float* __restrict__ gamma, int32_t dim, float eps,
                   float* y, int8_t* __restrict__ q, float2* __restrict__ ds) {
    pdl_wait();
    pdl_trigger();
    float* xr = x + int64_t(blockIdx.x) * dim;
    float* yr = y + int64_t(blockIdx.x) * dim;
    double ss = 0.0;
    if (res) {
        const float* rr = res + int64_t(blockIdx.x) * dim;
        for (int i = threadIdx.x; i < dim; i += kNormThreads) {
            const float v = xr[i] + rr[i];
            xr[i] = v;
            ss += double(v) * v;
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += kNormThreads) ss += double(xr[i]) * xr[i];
    }
    __shared__ double red[kNormThreads / kWarp];
    ss = warp_sum_double(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();   // also makes this block's writes of x visible to all its threads
    if (threadIdx.x < kWarp) {
        double v = threadIdx.x < kNormThreads / kWarp ? red[threadIdx.x] : 0.0;
        v = warp_sum_double(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    const float inv = rms_scale(red[0], dim, eps);
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

// Rows whose width is a multiple of 4 and at most 4 * kVecNormThreads * U: each thread keeps its
// U float4 of the row in registers, so the row is read once with every load in flight (the
// one-token decode norm is otherwise a chain of dependent loads). For the q8 output, eight
// consecutive lanes hold one 32-element block: the same arithmetic as q8_1_block.
constexpr int kVecNormThreads = 1024;

template <int U>
__global__ void __launch_bounds__(kVecNormThreads)
    rmsnorm_vec_kernel(float* x, const float* __restrict__ res, const float* __restrict__ gamma, int32_t dim, float eps,
                       float* y, int8_t* __restrict__ q, float2* __restrict__ ds, __half* __restrict__ xh) {
    const int n4 = dim / 4;
    float4* xr = reinterpret_cast<float4*>(x + int64_t(blockIdx.x) * dim);
    float4 v[U], g[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {   // gamma does not depend on the previous kernel: load it while that one ends
        const int i = threadIdx.x + k * blockDim.x;
        g[k] = i < n4 ? reinterpret_cast<const float4*>(gamma)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    pdl_wait();
    pdl_trigger();
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < U; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < n4) {
            v[k] = xr[i];
            if (res) {
                const float4 r = reinterpret_cast<const float4*>(res + int64_t(blockIdx.x) * dim)[i];
                v[k] = make_float4(v[k].x + r.x, v[k].y + r.y, v[k].z + r.z, v[k].w + r.w);
                xr[i] = v[k];
            }
        }
        ss += double(v[k].x) * v[k].x + double(v[k].y) * v[k].y + double(v[k].z) * v[k].z + double(v[k].w) * v[k].w;
    }
    __shared__ double red[kVecNormThreads / kWarp];
    ss = warp_sum_double(ss);
    const int lane = threadIdx.x & 31, n_warps = blockDim.x / kWarp;
    if (lane == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    const double tot = warp_sum_double(lane < n_warps ? red[lane] : 0.0);
    const float inv = rms_scale(tot, dim, eps);
#pragma unroll
    for (int k = 0; k < U; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        const float4 o = make_float4(v[k].x * inv * g[k].x, v[k].y * inv * g[k].y, v[k].z * inv * g[k].z,
                                     v[k].w * inv * g[k].w);
        if (i < n4) reinterpret_cast<float4*>(y + int64_t(blockIdx.x) * dim)[i] = o;
        if (xh && i < n4) store_dq4(xh, int64_t(blockIdx.x) * dim + 4 * int64_t(i), o);
        if (q) {   // dim % 32 == 0, so a group of 8 lanes is wholly inside or outside the row
            float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
            const Q8Scale sc = q8_scale(amax);
            const int q0 = q8_round(o.x, sc.id), q1 = q8_round(o.y, sc.id), q2 = q8_round(o.z, sc.id),
                      q3 = q8_round(o.w, sc.id);
            int sum = q0 + q1 + q2 + q3;
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
            if (i < n4) {
                const int64_t e = int64_t(blockIdx.x) * dim + 4 * int64_t(i);
                reinterpret_cast<char4*>(q)[e / 4] = make_char4(int8_t(q0), int8_t(q1), int8_t(q2), int8_t(q3));
                if ((lane & 7) == 0) ds[e / 32] = q8_1_ds(sc.d, sum);
            }
        }
    }
}

// Per-head RMS norm (Qwen3, Gemma 3 q/k norms), in place: one warp per head row of head_dim
// values, the same arithmetic as rmsnorm (double sum of squares, correctly rounded scale, then
// x * scale * gamma).
constexpr int kHeadNormWarps = 8;

__global__ void __launch_bounds__(kHeadNormWarps * kWarp)
    head_rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ gamma, int64_t n_rows, int32_t head_dim,
                        float eps) {
    pdl_wait();
    pdl_trigger();
    const int64_t r = int64_t(blockIdx.x) * kHeadNormWarps + (threadIdx.x >> 5);
    if (r >= n_rows) return;
    const int lane = threadIdx.x & 31;
    float* xr = x + r * head_dim;
    double ss = 0.0;
    for (int i = lane; i < head_dim; i += kWarp) ss += double(xr[i]) * xr[i];
    const float inv = rms_scale(warp_sum_double(ss), head_dim, eps);
    for (int i = lane; i < head_dim; i += kWarp) xr[i] = gamma ? xr[i] * inv * gamma[i] : xr[i] * inv;
}

// Rotates the pair (i, i + half) (neox) or (2i, 2i + 1) of one head's n_rot rotated dimensions by
// the rope's angle of pair i at pos, with the CPU backend's cos and sin (the table, rope_table.h;
// any scaling is in it).
__device__ __forceinline__ void rope_pair(const float* src, float* dst, int i, int pos, int n_rot,
                                          const float2* __restrict__ cos_sin, bool neox) {
    const int half = n_rot / 2;
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float2 r = rope_rotate(src[a], src[b], cos_sin[int64_t(pos) * half + i]);
    dst[a] = r.x;
    dst[b] = r.y;
}

__global__ void rope_kernel(float* __restrict__ x, const int32_t* __restrict__ pos, int32_t n_tok, int32_t n_heads,
                            int32_t head_dim, int32_t n_rot, const float2* __restrict__ cos_sin, bool neox) {
    pdl_wait();
    pdl_trigger();
    const int half = n_rot / 2;
    const int64_t total = int64_t(n_tok) * n_heads * half;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += int64_t(gridDim.x) * blockDim.x) {
        const int64_t th = g / half;   // token * n_heads + head
        float* h = x + th * head_dim;
        rope_pair(h, h, int(g % half), pos[th / n_heads], n_rot, cos_sin, neox);
    }
}

__global__ void attn_temperature_kernel(float* __restrict__ q, const int32_t* __restrict__ pos, int32_t n_tok,
                                        int64_t width, float temp_scale, int32_t temp_length, int32_t temp_offset) {
    pdl_wait();
    pdl_trigger();
    const int64_t total = int64_t(n_tok) * width;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += int64_t(gridDim.x) * blockDim.x) {
        // rope_temperature's double arithmetic, so the scale rounds as the CPU's.
        const double p = pos[g / width] + temp_offset;
        q[g] *= float(log(floor(p / temp_length) + 1.0) * temp_scale + 1.0);
    }
}

// rope of q (optional) and k, then k and v stored as f16 at each token's cache slot: one launch
// for what the forward asks as three ops. Per token: q pairs, then k pairs, then v pairs (none
// when the caches are null: a q8_0 cache is stored by its own kernel after the ropes).
__global__ void rope_kv_store_kernel(float* __restrict__ q, int32_t n_head_q, float* __restrict__ k,
                                     const float* __restrict__ v, int32_t n_head_kv, int32_t head_dim, int32_t n_rot,
                                     const float2* __restrict__ cos_sin, bool neox, __half* __restrict__ kc,
                                     __half* __restrict__ vc, int32_t block_size, int32_t n_tok, DeviceBatch b,
                                     bool early) {
    // early: trigger first, so the decode attention that follows streams the older cache while
    // this kernel waits.
    if (early) pdl_trigger();
    pdl_wait();
    if (!early) pdl_trigger();
    const int half = n_rot / 2, kv_dim = n_head_kv * head_dim;
    const bool store = kc != nullptr;   // then n_rot == head_dim
    const int nq = n_head_q * half, nk = n_head_kv * half, per_tok = nq + (store ? 2 : 1) * nk;
    const int64_t total = int64_t(n_tok) * per_tok;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += int64_t(gridDim.x) * blockDim.x) {
        const int t = int(g / per_tok), r = int(g % per_tok);
        const int p = b.pos[t];
        if (r < nq) {
            float* h = q + (int64_t(t) * n_head_q + r / half) * head_dim;
            rope_pair(h, h, r % half, p, n_rot, cos_sin, neox);
            continue;
        }
        if (!store) {
            const int j = r - nq;
            float* h = k + int64_t(t) * kv_dim + (j / half) * head_dim;
            rope_pair(h, h, j % half, p, n_rot, cos_sin, neox);
            continue;
        }
        const int64_t phys = b.block_table[int64_t(b.seq[t]) * b.max_blocks + p / block_size];
        __half* dst_row = (r < nq + nk ? kc : vc) + (phys * block_size + p % block_size) * kv_dim;
        if (r < nq + nk) {
            const int j = r - nq, head = j / half, i = j % half;
            float* h = k + int64_t(t) * kv_dim + head * head_dim;
            rope_pair(h, h, i, p, n_rot, cos_sin, neox);
            const int a = neox ? i : 2 * i, c = neox ? i + half : 2 * i + 1;
            dst_row[head * head_dim + a] = __float2half_rn(h[a]);
            dst_row[head * head_dim + c] = __float2half_rn(h[c]);
        } else {
            const int e = 2 * (r - nq - nk);
            const float2 val = *reinterpret_cast<const float2*>(v + int64_t(t) * kv_dim + e);
            *reinterpret_cast<__half2*>(dst_row + e) = __floats2half2_rn(val.x, val.y);
        }
    }
}

}  // namespace

void rmsnorm(float* x, const float* res, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y, int8_t* q,
             float2* ds, cudaStream_t s, __half* xh) {
    if (n_tok <= 0) return;
    if ((q || xh) && dim % 32)
        fail("cuda rmsnorm: a q8 or f16 block output needs a width that is a multiple of 32, got ", dim);
    const int n4 = dim / 4;
    if (dim % 4 == 0 && n4 <= 4 * kVecNormThreads) {
        const int per = (n4 + kVecNormThreads - 1) / kVecNormThreads;   // float4 per thread
        const int threads = ((n4 + per - 1) / per + kWarp - 1) / kWarp * kWarp;
        if (per == 1)
            launch_pdl(rmsnorm_vec_kernel<1>, unsigned(n_tok), threads, s, x, res, gamma, dim, eps, y, q, ds, xh);
        else if (per == 2)
            launch_pdl(rmsnorm_vec_kernel<2>, unsigned(n_tok), threads, s, x, res, gamma, dim, eps, y, q, ds, xh);
        else launch_pdl(rmsnorm_vec_kernel<4>, unsigned(n_tok), threads, s, x, res, gamma, dim, eps, y, q, ds, xh);
    } else {
        launch_pdl(rmsnorm_kernel, unsigned(n_tok), kNormThreads, s, x, res, gamma, dim, eps, y, q, ds);
        if (xh) gemm_dq_input(y, xh, n_tok, dim, s);   // wide rows: the conversion as a kernel of its own
    }
    EMBER_CUDA_LAUNCHED("rmsnorm");
}

void head_rmsnorm(float* x, const float* gamma, int32_t n_tok, int32_t n_heads, int32_t head_dim, float eps,
                  cudaStream_t s) {
    if (head_dim <= 0) fail("cuda head_rmsnorm: head_dim ", head_dim, " must be positive");
    const int64_t n_rows = int64_t(n_tok) * n_heads;
    if (n_rows <= 0) return;
    launch_pdl(head_rmsnorm_kernel, unsigned((n_rows + kHeadNormWarps - 1) / kHeadNormWarps), kHeadNormWarps * kWarp, s,
               x, gamma, n_rows, head_dim, eps);
    EMBER_CUDA_LAUNCHED("head_rmsnorm");
}

void rope(float* x, const int32_t* pos, int32_t n_tok, int32_t n_heads, int32_t head_dim, int32_t n_rot,
          const float2* cos_sin, bool neox, cudaStream_t s) {
    if (n_rot <= 0 || n_rot % 2 || n_rot > head_dim)
        fail("cuda rope: ", n_rot, " rotated dimensions of a head of ", head_dim, " (must be even, at most the head)");
    const int64_t total = int64_t(n_tok) * n_heads * (n_rot / 2);
    if (total == 0) return;
    const unsigned grid = unsigned(std::min<int64_t>((total + 255) / 256, 65536));
    launch_pdl(rope_kernel, grid, 256, s, x, pos, n_tok, n_heads, head_dim, n_rot, cos_sin, neox);
    EMBER_CUDA_LAUNCHED("rope");
}

void attn_temperature(float* q, const int32_t* pos, int32_t n_tok, int64_t width, float temp_scale, int32_t temp_length,
                      int32_t temp_offset, cudaStream_t s) {
    if (temp_length <= 0) fail("cuda attn_temperature: temp_length ", temp_length, " must be positive");
    const int64_t total = int64_t(n_tok) * width;
    if (total == 0) return;
    const unsigned grid = unsigned(std::min<int64_t>((total + 255) / 256, 65536));
    launch_pdl(attn_temperature_kernel, grid, 256, s, q, pos, n_tok, width, temp_scale, temp_length, temp_offset);
    EMBER_CUDA_LAUNCHED("attn_temperature");
}

void rope_kv_store(float* q, int32_t n_head_q, float* k, const float* v, int32_t n_head_kv, int32_t head_dim,
                   int32_t n_rot, const float2* cos_sin, bool neox, __half* k_cache, __half* v_cache,
                   int32_t block_size, int32_t n_tok, const DeviceBatch& b, bool early, cudaStream_t s) {
    if (n_rot <= 0 || n_rot % 2 || n_rot > head_dim)
        fail("cuda rope: ", n_rot, " rotated dimensions of a head of ", head_dim, " (must be even, at most the head)");
    if (k_cache && n_rot != head_dim)
        fail("cuda rope_kv_store: storing the caches needs the whole head rotated (", n_rot, " of ", head_dim, ")");
    const int64_t total = int64_t(n_tok) * (n_head_q + (k_cache ? 2 : 1) * n_head_kv) * (n_rot / 2);
    if (total == 0) return;
    const unsigned grid = unsigned(std::min<int64_t>((total + 255) / 256, 65536));
    launch_pdl(rope_kv_store_kernel, grid, 256, s, q, q ? n_head_q : 0, k, v, n_head_kv, head_dim, n_rot, cos_sin, neox,
               k_cache, v_cache, block_size, n_tok, b, early);
    EMBER_CUDA_LAUNCHED("rope_kv_store");
}

}  // namespace cuda
}  // namespace ember
