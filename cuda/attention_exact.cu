// Reference-order attention for short contexts (len <= kExactMaxLen): the arithmetic of the CPU
// backend and llama.cpp step for step: q rounded to f16, each q.k a sequential sum over dims
// without fused multiply-adds, a two-pass softmax, probabilities normalized then rounded to f16,
// each output a sequential sum over positions. Greedy decoding then follows the reference token
// for token far longer than with a reordered sum.
// The sums are sequential, so speed comes from spreading the loads: a few hundred keys of one
// head are ~1 us of HBM traffic, and the chains of adds are short, so what a launch costs is how
// many SMs pull its K and V and how far they are in flight when the kernel before it finishes.
// - On Hopper, a cluster of ceil(head_dim / 32) CTAs per (token, q head): CTA r copies whole K rows
//   of the r-th range of keys into shared memory and scores them, sends the scores to every CTA of
//   the cluster (distributed shared memory), and each CTA then runs the softmax over all of them
//   (the same sums, so the same bits in each) and the output's 32 dims r * 32 .. as one warp.
// - Elsewhere (and with EMBER_CUDA_EXACT_CLUSTER=0), one CTA per (token, q head): V streams
//   through a kExactStages-deep cp.async pipeline started before the scores, and each thread's K
//   row is loaded eight 16-byte words at a time.
#include <cooperative_groups.h>

#include <algorithm>
#include <utility>

#include "async_copy.cuh"
#include "attention_splits.cuh"
#include "common.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

// Also fixes the order of the softmax's double sum (thread-strided partial sums, then the warps).
constexpr int kExactThreads = 256;
constexpr int kExactWarps = kExactThreads / kWarp;
constexpr int kExactMaxHeadDim = 256;
constexpr int kExactChunk = 64;    // one-CTA kernel: V positions per pipeline stage
constexpr int kExactStages = 4;
constexpr int kExactDims = 32;     // cluster kernel: output dims a CTA takes (one warp, one q8_1 block)

// acc + q[0] k[0] + ... + q[7] k[7] for the 8 f16 values of k, one rounded product and one
// rounded sum at a time.
__device__ __forceinline__ float dot8_in_order(float acc, const float* q, uint4 k) {
    float kf[8];
    unpack8(k, kf);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc = __fadd_rn(acc, __fmul_rn(q[j], kf[j]));
    return acc;
}

// o + p[0] v[0] + p[1] v[stride] + ... over n positions, in order.
__device__ __forceinline__ float pv_in_order(float o, const float* p, const __half* v, int stride, int n) {
#pragma unroll 8
    for (int j = 0; j < n; ++j) o = __fadd_rn(o, __fmul_rn(p[j], __half2float(v[j * stride])));
    return o;
}

// The n scores in ps (shared memory) become probabilities: exp(s - max) by glibc's expf, divided
// by their sum (in double), rounded to f16. mx: the calling thread's max over ps[threadIdx.x],
// ps[threadIdx.x + kExactThreads], ...; the sum runs over the same split. A sink logit (-inf:
// none) joins the max and, last, the sum, as on the CPU. Every thread of the CTA calls it; the
// probabilities are visible to all on return.
__device__ void softmax_in_order(float* ps, int n, float mx, float sink) {
    __shared__ float red_f[kExactWarps];
    __shared__ double red_d[kExactWarps];
    const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
    mx = warp_max(mx);
    if (lane == 0) red_f[warp] = mx;
    __syncthreads();
    mx = fmaxf(red_f[0], sink);
    for (int w = 1; w < kExactWarps; ++w) mx = fmaxf(mx, red_f[w]);
    double sum = 0.0;
    for (int p = threadIdx.x; p < n; p += kExactThreads) {
        ps[p] = expf_glibc(ps[p] - mx);
        sum += double(ps[p]);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) red_d[warp] = sum;
    __syncthreads();
    sum = 0.0;
    for (int w = 0; w < kExactWarps; ++w) sum += red_d[w];
    if (sink != -INFINITY) sum += double(expf_glibc(sink - mx));
    const float inv = float(1.0 / sum);
    for (int p = threadIdx.x; p < n; p += kExactThreads) ps[p] = __half2float(__float2half_rn(__fmul_rn(ps[p], inv)));
    __syncthreads();
}

// A scaled score soft-capped (AttentionShape::softcap) in the CPU's steps (src/cpu/cpu_attention.cpp's
// softcap_score: tanh from glibc's expf), so the bits stay the CPU's.
__device__ __forceinline__ float softcap_score(const AttentionArgs& a, float s) {
    if (a.softcap <= 0.f) return s;
    const float x = __fdiv_rn(s, a.softcap);
    const float e = expf_glibc(__fmul_rn(-2.f, fabsf(x)));
    return copysignf(__fmul_rn(a.softcap, __fdiv_rn(__fadd_rn(1.f, -e), __fadd_rn(1.f, e))), x);
}

__device__ __forceinline__ float sink_logit(const AttentionArgs& a, int h) { return a.sinks ? a.sinks[h] : -INFINITY; }

__device__ __forceinline__ float q_f16(const AttentionArgs& a, int t, int h, int i) {
    return __half2float(__float2half_rn(a.q[(int64_t(t) * a.n_head + h) * a.head_dim + i]));
}

__global__ void __launch_bounds__(kExactThreads) attention_exact_kernel(AttentionArgs a, DeviceBatch b) {
    extern __shared__ uint4 vbuf[];   // [kExactStages][kExactChunk][head_dim / 8]
    const int t = blockIdx.x, h = blockIdx.y;
    const int hd = a.head_dim, n8 = hd / 8, kvh = h / (a.n_head / a.n_head_kv), kv_dim = a.n_head_kv * hd;
    {
        // Only the current position's K/V row comes from the kernels this one waits for: the
        // earlier rows' lines are asked into L2 before the wait, so the loads after it skip a
        // DRAM round trip. Position and block table are read past L1 (__ldcg); a prefetch only
        // moves lines, so no value read here reaches the results.
        const int len0 = __ldcg(b.pos + t);
        const int32_t* bt0 = b.block_table + int64_t(__ldcg(b.seq + t)) * b.max_blocks;
        for (int p = threadIdx.x; p < min(len0, kExactMaxLen); p += kExactThreads) {
            const int64_t r = (int64_t(__ldcg(bt0 + p / a.block_size)) * a.block_size + p % a.block_size) * kv_dim +
                              int64_t(kvh) * hd;
            for (int off = 0; off < hd; off += 64) {   // 128-byte lines
                prefetch_l2(a.k_cache + r + off);
                prefetch_l2(a.v_cache + r + off);
            }
        }
    }
    pdl_wait();
    pdl_trigger();
    // Keys first .. first + n_keys - 1 (all up to the token's position, or its window's), in
    // order from the first, as the CPU visits them.
    const int len = b.pos[t] + 1;
    const int first = attention_first_key(a, len - 1), n_keys = len - first;
    __shared__ float qs[kExactMaxHeadDim];
    __shared__ float ps[kExactMaxLen];
    const int32_t* bt = b.block_table + int64_t(b.seq[t]) * b.max_blocks;
    const int bs = a.block_size;
    auto row = [&](int p) { return (int64_t(bt[p / bs]) * bs + p % bs) * kv_dim + int64_t(kvh) * hd; };

    // V chunk c -> stage c % kExactStages. Every thread commits a group per call (empty past the
    // end) so the wait counts below are the same for all.
    const int n_chunks = (n_keys + kExactChunk - 1) / kExactChunk;
    auto issue_v = [&](int c) {
        if (c < n_chunks) {
            uint4* dst = vbuf + (c % kExactStages) * kExactChunk * n8;
            const int p0 = first + c * kExactChunk, n = min(kExactChunk, len - p0) * n8;
            for (int e = threadIdx.x; e < n; e += kExactThreads)
                cp_async16(dst + e, a.v_cache + row(p0 + e / n8) + 8 * (e % n8));
        }
        cp_async_commit();
    };
    for (int c = 0; c < kExactStages - 1; ++c) issue_v(c);

    for (int i = threadIdx.x; i < hd; i += kExactThreads) qs[i] = q_f16(a, t, h, i);
    __syncthreads();
    float mx = -INFINITY;
    for (int p = threadIdx.x; p < n_keys; p += kExactThreads) {   // (ps is indexed from first)
        const uint4* kp = reinterpret_cast<const uint4*>(a.k_cache + row(first + p));
        float acc = 0.f;
        for (int c0 = 0; c0 < n8; c0 += 16) {   // (a head_dim 128 row in one round of loads)
            uint4 r[16];
#pragma unroll
            for (int u = 0; u < 16; ++u) r[u] = c0 + u < n8 ? kp[c0 + u] : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < 16; ++u) {
                if (c0 + u >= n8) break;
                acc = dot8_in_order(acc, qs + 8 * (c0 + u), r[u]);
            }
        }
        ps[p] = softcap_score(a, __fmul_rn(acc, a.scale));
        mx = fmaxf(mx, ps[p]);
    }
    softmax_in_order(ps, n_keys, mx, sink_logit(a, h));

    float o = 0.f;
    for (int c = 0; c < n_chunks; ++c) {
        issue_v(c + kExactStages - 1);   // reuses the stage chunk c - 1 had, released by the last barrier
        cp_async_wait<kExactStages - 1>();
        __syncthreads();
        if (threadIdx.x < hd) {
            const __half* vs = reinterpret_cast<const __half*>(vbuf + (c % kExactStages) * kExactChunk * n8) +
                               threadIdx.x;
            o = pv_in_order(o, ps + c * kExactChunk, vs, hd, min(kExactChunk, n_keys - c * kExactChunk));
        }
        __syncthreads();
    }
    const int64_t e = int64_t(t) * a.n_head * hd + int64_t(h) * hd + threadIdx.x;
    if (threadIdx.x < hd) store_out(a, e, o);
}

int exact_cluster_ctas(int head_dim) { return (head_dim + kExactDims - 1) / kExactDims; }

// Dynamic shared memory of the cluster kernel: K rows of one CTA's range of keys
// ([keys][head_dim + 8] halves: the 16 bytes of padding put the rows that the 8 lanes of a
// quarter warp read at once on different banks), then V's kExactDims columns of every key.
size_t exact_cluster_smem(int head_dim) {
    const int n_cta = exact_cluster_ctas(head_dim);
    const size_t k_rows = size_t((kExactMaxLen + n_cta - 1) / n_cta) * (head_dim + 8);
    return sizeof(__half) * (k_rows + size_t(kExactMaxLen) * kExactDims);
}

// One CTA an SM at least: ptxas then gives the kernel the registers it wants (a decode step runs a
// cluster a head, far fewer CTAs than the SMs hold, so occupancy costs nothing here).
__global__ void __launch_bounds__(kExactThreads, 1) attention_exact_cluster_kernel(AttentionArgs a, DeviceBatch b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    // The scores are written into the other CTAs' shared memory, which needs them all started:
    // this arrival and the wait before the first such write say so.
    auto started = cluster.barrier_arrive();
    const int n_cta = int(cluster.num_blocks()), rank = int(cluster.block_rank());
    const int t = blockIdx.x / n_cta, h = blockIdx.y;
    const int hd = a.head_dim, n8 = hd / 8, kvh = h / (a.n_head / a.n_head_kv), k_row = hd + 8;
    const int64_t kv_dim = int64_t(a.n_head_kv) * hd;
    extern __shared__ uint4 smem_words[];
    __half* ks = reinterpret_cast<__half*>(smem_words);
    __half* vs = ks + (kExactMaxLen + n_cta - 1) / n_cta * k_row;
    __shared__ float qs[kExactMaxHeadDim];
    __shared__ float ps[kExactMaxLen];   // every key's score, then probability (indexed from first)

    // Positions and block tables come from the step's upload (copy_from_pinned), which lets later
    // kernels start only once its copies are done, so they may be read before this kernel's wait.
    const int len = __ldcg(b.pos + t) + 1;
    const int first = attention_first_key(a, len - 1), n_keys = len - first;
    const int per = (n_keys + n_cta - 1) / n_cta;
    const int j0 = rank * per, nk = max(0, min(n_keys, j0 + per) - j0);   // this CTA's keys: j0 .. j0 + nk - 1
    const int d0 = rank * kExactDims, nd = min(kExactDims, hd - d0), nw = nd / 8;
    // The sequence's block table into shared memory first: the copies' addresses then wait on no
    // global load each.
    __shared__ int32_t bts[kExactMaxLen];
    const int bs = a.block_size;
    {
        const int32_t* bt = b.block_table + int64_t(__ldcg(b.seq + t)) * b.max_blocks;
        for (int i = threadIdx.x; i <= (len - 1) / bs; i += kExactThreads) bts[i] = __ldcg(bt + i);
        __syncthreads();
    }
    auto row = [&](int j) {
        const int p = first + j;
        return (int64_t(bts[p / bs]) * bs + p % bs) * kv_dim + int64_t(kvh) * hd;
    };
    auto copy_k = [&](int from, int to) {   // this CTA's keys j0 + from .. j0 + to - 1
        for (int e = threadIdx.x; e < (to - from) * n8; e += kExactThreads) {
            const int j = from + e / n8, c = e % n8;
            cp_async16(ks + j * k_row + 8 * c, a.k_cache + row(j0 + j) + 8 * c);
        }
    };
    auto copy_v = [&](int from, int to) {   // keys from .. to - 1, this CTA's dims
        for (int e = threadIdx.x; e < (to - from) * nw; e += kExactThreads) {
            const int j = from + e / nw, c = e % nw;
            cp_async16(vs + j * kExactDims + 8 * c, a.v_cache + row(j) + d0 + 8 * c);
        }
    };
    // Where every token is the only one of its sequence in the step (a.old_rows_ready), the rows
    // before its own position were written by earlier steps: they are copied before the wait.
    // Otherwise they are only asked into L2 (a prefetch moves lines, no value read here is used).
    const int n_old = a.old_rows_ready ? n_keys - 1 : 0;
    const int k_old = min(nk, max(0, n_old - j0));
    if (a.old_rows_ready) {
        copy_k(0, k_old);
        copy_v(0, n_old);
    } else {
        for (int j = threadIdx.x; j < n_keys; j += kExactThreads) {
            const int64_t r = row(j);
            if (j >= j0 && j < j0 + nk)
                for (int off = 0; off < hd; off += 64) prefetch_l2(a.k_cache + r + off);   // 128-byte lines
            prefetch_l2(a.v_cache + r + d0);
        }
    }
    cp_async_commit();
    pdl_wait();
    pdl_trigger();
    copy_k(k_old, nk);
    cp_async_commit();
    copy_v(n_old, n_keys);
    cp_async_commit();
    for (int i = threadIdx.x; i < hd; i += kExactThreads) qs[i] = q_f16(a, t, h, i);
    cp_async_wait<1>();   // every group but the last (V after the wait)
    __syncthreads();

    cluster.barrier_wait(std::move(started));
    for (int j = threadIdx.x; j < nk; j += kExactThreads) {
        const uint4* kr = reinterpret_cast<const uint4*>(ks + j * k_row);
        float acc = 0.f;
#pragma unroll 4
        for (int c = 0; c < n8; ++c) acc = dot8_in_order(acc, qs + 8 * c, kr[c]);
        const float s = softcap_score(a, __fmul_rn(acc, a.scale));
        for (int r = 0; r < n_cta; ++r) cluster.map_shared_rank(ps, r)[j0 + j] = s;
    }
    cluster.sync();   // every score in every CTA; no shared memory of another CTA is touched after it
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n_keys; j += kExactThreads) mx = fmaxf(mx, ps[j]);
    softmax_in_order(ps, n_keys, mx, sink_logit(a, h));
    cp_async_wait<0>();
    __syncthreads();
    if (threadIdx.x < nd) {
        const float o = pv_in_order(0.f, ps, vs + threadIdx.x, kExactDims, n_keys);
        store_out(a, (int64_t(t) * a.n_head + h) * hd + d0 + threadIdx.x, o);
    }
#endif
}

// The cluster kernel shortens each head's chain of latencies but gives it more CTAs, each
// holding its shared memory for the whole chain: it pays only while the grid fits the GPU at once
// (a few tokens); larger batches fill the GPU with one CTA a head. Set up once (the opt-in above
// 48 KB for the largest head dim's shared memory): how many of its CTAs the GPU holds at once.
int64_t exact_cluster_ctas_at_once() {
    static const int64_t n = [] {
        size_t smem = 0;
        for (int hd = 8; hd <= kExactMaxHeadDim; hd += 8) smem = std::max(smem, exact_cluster_smem(hd));
        EMBER_CUDA_CHECK(cudaFuncSetAttribute(attention_exact_cluster_kernel,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        int dev = 0, sms = 0, per_sm = 0;
        EMBER_CUDA_CHECK(cudaGetDevice(&dev));
        EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        EMBER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_exact_cluster_kernel,
                                                                       kExactThreads, smem));
        return int64_t(sms) * per_sm;
    }();
    return n;
}

}  // namespace

void attention_exact(const AttentionArgs& a, const DeviceBatch& b, bool clusters, cudaStream_t s) {
    if (a.head_dim % 8 || a.head_dim > kExactMaxHeadDim)
        fail("cuda attention: head_dim ", a.head_dim, " must be a multiple of 8 and at most ", kExactMaxHeadDim);
    if (a.n_tok == 0) return;
    const int n_cta = exact_cluster_ctas(a.head_dim);
    if (clusters && device_is_sm90() && int64_t(a.n_tok) * a.n_head * n_cta <= exact_cluster_ctas_at_once()) {
        launch_pdl_cluster(attention_exact_cluster_kernel, dim3(unsigned(a.n_tok * n_cta), unsigned(a.n_head)),
                           dim3(kExactThreads), exact_cluster_smem(a.head_dim), unsigned(n_cta), s, a, b);
        EMBER_CUDA_LAUNCHED("attention_exact_cluster");
        return;
    }
    static size_t smem_set = 0;   // the opt-in above 48 KB, once per size
    const size_t smem = size_t(kExactStages) * kExactChunk * a.head_dim * sizeof(__half);
    if (smem > smem_set) {
        EMBER_CUDA_CHECK(
            cudaFuncSetAttribute(attention_exact_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        smem_set = smem;
    }
    launch_pdl_smem(attention_exact_kernel, dim3(unsigned(a.n_tok), unsigned(a.n_head)), dim3(kExactThreads), smem, s,
                    a, b);
    EMBER_CUDA_LAUNCHED("attention_exact");
}

}  // namespace cuda
}  // namespace ember
