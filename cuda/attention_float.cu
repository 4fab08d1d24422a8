// The f32 KV cache on the GPU: storing rows as they are, and the attention that reads them. A user
// asks for an f32 cache to compare with an f32 reference (transformers, the CPU's exact runs), so
// this attention keeps everything in f32: q unrounded, f32 dot products, an online softmax with
// accurate exponentials, probabilities never rounded. Its speed is secondary; one CTA per (token,
// q head). A layer whose other cache is not f32 reads that one as f16 (its f16 copy for blocked
// and bf16 types), still with f32 arithmetic.
#include "common.cuh"
#include "kernel_choice.h"
#include "kernels.h"
#include "kv_store_rows.cuh"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kFloatThreads = 128;
constexpr int kFloatWarps = kFloatThreads / kWarp;
constexpr int kFloatKeys = 128;                                   // scores held in shared memory at once
constexpr int kFloatDimsPerThread = kMaxAttnHeadDim / kFloatThreads;   // output dims a thread accumulates

struct Unchanged {
    __device__ float operator()(float x) const { return x; }
};

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }

template <class KT, class VT>
__global__ void __launch_bounds__(kFloatThreads) attention_float_kernel(AttentionArgs a, DeviceBatch b) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x, h = blockIdx.y;
    const int hd = a.head_dim, kvh = h / (a.n_head / a.n_head_kv);
    const int64_t kv_dim = int64_t(a.n_head_kv) * hd;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const KT* kc = reinterpret_cast<const KT*>(a.k_cache);
    const VT* vc = reinterpret_cast<const VT*>(a.v_cache);
    const int32_t* bt = b.block_table + int64_t(b.seq[t]) * b.max_blocks;
    const int bs = a.block_size;
    auto row = [&](int p) { return (int64_t(bt[p / bs]) * bs + p % bs) * kv_dim + int64_t(kvh) * hd; };

    __shared__ float qs[kMaxAttnHeadDim];
    __shared__ float ps[kFloatKeys];
    __shared__ float red[kFloatWarps];
    for (int i = threadIdx.x; i < hd; i += kFloatThreads) qs[i] = a.q[(int64_t(t) * a.n_head + h) * hd + i];
    __syncthreads();

    const int last = b.pos[t], first = attention_first_key(a, last);
    // A sink is a key of zero value: it starts the running max and sum.
    const float sink = a.sinks ? a.sinks[h] : -INFINITY;
    float m = sink, l = a.sinks ? 1.f : 0.f;
    float o[kFloatDimsPerThread] = {};
    for (int p0 = first; p0 <= last; p0 += kFloatKeys) {
        const int n = min(kFloatKeys, last + 1 - p0);
        // A warp a key: its lanes split the dims, then the warp sums them.
        for (int j = warp; j < n; j += kFloatWarps) {
            const KT* kr = kc + row(p0 + j);
            float acc = 0.f;
            for (int i = lane; i < hd; i += kWarp) acc = fmaf(qs[i], load(kr + i), acc);
            acc = warp_sum(acc) * a.scale;
            if (a.softcap > 0.f) acc = a.softcap * tanhf(acc / a.softcap);
            if (lane == 0) ps[j] = acc;
        }
        __syncthreads();
        float mx = -INFINITY;
        for (int j = threadIdx.x; j < n; j += kFloatThreads) mx = fmaxf(mx, ps[j]);
        mx = warp_max(mx);
        if (lane == 0) red[warp] = mx;
        __syncthreads();
        float m_new = m;
        for (int w = 0; w < kFloatWarps; ++w) m_new = fmaxf(m_new, red[w]);
        const float alpha = expf(m - m_new);   // m = -inf before the first key: alpha 0, nothing to scale
        l *= alpha;
#pragma unroll
        for (int d = 0; d < kFloatDimsPerThread; ++d) o[d] *= alpha;
        for (int j = 0; j < n; ++j) {
            const float pj = expf(ps[j] - m_new);
            l += pj;
            const VT* vr = vc + row(p0 + j);
#pragma unroll
            for (int d = 0; d < kFloatDimsPerThread; ++d) {
                const int i = threadIdx.x + d * kFloatThreads;
                if (i < hd) o[d] = fmaf(pj, load(vr + i), o[d]);
            }
        }
        m = m_new;
        __syncthreads();   // ps and red are rewritten by the next range
    }
    const float inv = 1.f / l;
#pragma unroll
    for (int d = 0; d < kFloatDimsPerThread; ++d) {
        const int i = threadIdx.x + d * kFloatThreads;
        if (i < hd) a.out[(int64_t(t) * a.n_head + h) * hd + i] = o[d] * inv;
    }
}

}  // namespace

void kv_store_f32(float* k_cache, float* v_cache, int32_t block_size, int32_t kv_dim, const float* k, const float* v,
                  int32_t n_tok, const DeviceBatch& b, cudaStream_t s) {
    if (n_tok <= 0 || (!k_cache && !v_cache)) return;
    launch_pdl(kv_store_rows_kernel<float, Unchanged>, unsigned(n_tok), 128, s, k_cache, v_cache, block_size, kv_dim, k,
               v, b);
    EMBER_CUDA_LAUNCHED("kv_store_f32");
}

void attention_float(const AttentionArgs& a, bool k_f32, bool v_f32, const DeviceBatch& b, cudaStream_t s) {
    if (a.head_dim > kMaxAttnHeadDim)
        fail("cuda attention_float: head_dim ", a.head_dim, " is above ", kMaxAttnHeadDim);
    if (a.n_tok == 0) return;
    const dim3 grid(unsigned(a.n_tok), unsigned(a.n_head));
    if (k_f32 && v_f32) launch_pdl(attention_float_kernel<float, float>, grid, kFloatThreads, s, a, b);
    else if (k_f32) launch_pdl(attention_float_kernel<float, __half>, grid, kFloatThreads, s, a, b);
    else if (v_f32) launch_pdl(attention_float_kernel<__half, float>, grid, kFloatThreads, s, a, b);
    else launch_pdl(attention_float_kernel<__half, __half>, grid, kFloatThreads, s, a, b);
    EMBER_CUDA_LAUNCHED("attention_float");
}

}  // namespace cuda
}  // namespace ember
