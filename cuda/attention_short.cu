// Decode attention over a short f16 context for steps that need not follow the CPU's order of
// sums (the engine's default mode, where EMBER_CUDA_SHORT_ATTN=1 asks for it; a Context keeps
// attention_exact). q and the probabilities stay float. What bounds such a step is
// latency, not bytes (a few hundred keys a head are little HBM traffic a layer), so the kernel
// is built to have as little as possible left to do once the Q, K, V kernel before it finishes.
// - One cluster of CTAs per (token, kv head); each CTA takes a contiguous range of <=
//   kShortKeys keys and all q heads of the kv head (GQA: K/V read once).
// - K and V rows go to shared memory by cp.async. Every row before the token's own position was
//   written by an earlier step, so those copies are issued before the PDL wait; only the
//   token's own row waits for the kernel that stores it.
// - Scores, the softmax and P V run out of shared memory; the cluster's partial results
//   (max, sum, unnormalized output) merge through distributed shared memory, no second launch.
// Only decode batches take it: each token the only one of its sequence in the step.
#include <cooperative_groups.h>

#include "async_copy.cuh"
#include "attention_splits.cuh"
#include "common.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kShortThreads = 128;
constexpr int kShortWarps = kShortThreads / kWarp;
constexpr int kShortKeys = kShortKeysPerCta;   // keys a CTA takes at most
constexpr int kShortMaxSplit = 8;   // CTAs a cluster (the portable cluster size)
static_assert(kShortKeys * kShortMaxSplit == kShortMaxLen, "a cluster covers every short context");

// Shared memory of one CTA, in order: K rows, V rows ([kShortKeys][HD + 8] halves: the 16 bytes
// of padding put the rows that the 8 lanes of a quarter warp read at once on different banks),
// q [n_rep][HD], scores [n_rep][kShortKeys], the partial output [n_rep][HD], max and sum [n_rep].
template <int HD>
struct ShortSmem {
    static constexpr int kRow = HD + 8;   // halves
    static constexpr size_t kKV = size_t(2) * kShortKeys * kRow * sizeof(__half);
    static size_t bytes(int n_rep) { return kKV + sizeof(float) * size_t(n_rep) * (2 * HD + kShortKeys + 2); }
};

template <int HD>
__global__ void __launch_bounds__(kShortThreads) attention_short_kernel(AttentionArgs a, DeviceBatch b) {
    using S = ShortSmem<HD>;
    constexpr int kRow = S::kRow, kWords = HD / 8;   // 16-byte words a row
    extern __shared__ uint4 smem_words[];
    __half* ks = reinterpret_cast<__half*>(smem_words);
    __half* vs = ks + kShortKeys * kRow;
    const int n_rep = a.n_head / a.n_head_kv;
    float* qs = reinterpret_cast<float*>(vs + kShortKeys * kRow);
    float* ps = qs + n_rep * HD;
    float* os = ps + n_rep * kShortKeys;
    float* ms = os + n_rep * HD;
    float* ls = ms + n_rep;

    const int split = blockIdx.x, n_split = gridDim.x, kvh = blockIdx.y, t = blockIdx.z;
    const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
    // Positions and block tables come from the step's upload (copy_from_pinned), which lets later
    // kernels start only once its copies are done, so they may be read before this kernel's wait.
    const int len = b.pos[t] + 1;
    const int first = attention_first_key(a, len - 1), n_keys = len - first;
    const int per = (n_keys + n_split - 1) / n_split;
    const int k0 = first + split * per, nk = max(0, min(len, k0 + per) - k0);
    const int32_t* bt = b.block_table + int64_t(b.seq[t]) * b.max_blocks;
    const int bs = a.block_size;
    const int64_t kv_dim = int64_t(a.n_head_kv) * HD;
    auto copy_rows = [&](int j0, int j1) {   // keys k0 + j0 .. k0 + j1 - 1 into rows j0 .. j1 - 1
        for (int e = threadIdx.x; e < (j1 - j0) * kWords; e += kShortThreads) {
            const int j = j0 + e / kWords, c = e % kWords, p = k0 + j;
            const int64_t g = (int64_t(bt[p / bs]) * bs + p % bs) * kv_dim + int64_t(kvh) * HD + 8 * c;
            cp_async16(ks + j * kRow + 8 * c, a.k_cache + g);
            cp_async16(vs + j * kRow + 8 * c, a.v_cache + g);
        }
    };
    const int n_old = max(0, min(nk, len - 1 - k0));   // rows before the token's own
    copy_rows(0, n_old);
    cp_async_commit();
    pdl_wait();
    pdl_trigger();
    copy_rows(n_old, nk);
    cp_async_commit();
    // q scaled into the log2 domain, so exp2 gives the softmax.
    const float* qg = a.q + (int64_t(t) * a.n_head + int64_t(kvh) * n_rep) * HD;
    const float qscale = a.scale * kLog2e;
    for (int i = threadIdx.x; i < n_rep * HD; i += kShortThreads) qs[i] = qg[i] * qscale;
    cp_async_wait<0>();
    __syncthreads();

    // Scores: a thread per (q head, key), consecutive threads on consecutive keys.
    for (int e = threadIdx.x; e < n_rep * nk; e += kShortThreads) {
        const int h = e / nk, j = e % nk;
        const uint4* kr = reinterpret_cast<const uint4*>(ks + j * kRow);
        const float4* qh = reinterpret_cast<const float4*>(qs + h * HD);
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int c = 0; c < kWords; ++c) {
            float kf[8];
            unpack8(kr[c], kf);
            const float4 qa = qh[2 * c], qb = qh[2 * c + 1];
            s0 = fmaf(qa.x, kf[0], s0);
            s1 = fmaf(qa.y, kf[1], s1);
            s0 = fmaf(qa.z, kf[2], s0);
            s1 = fmaf(qa.w, kf[3], s1);
            s0 = fmaf(qb.x, kf[4], s0);
            s1 = fmaf(qb.y, kf[5], s1);
            s0 = fmaf(qb.z, kf[6], s0);
            s1 = fmaf(qb.w, kf[7], s1);
        }
        ps[h * kShortKeys + j] = softcap_log2(a, s0 + s1);
    }
    __syncthreads();
    // This CTA's softmax state per q head: a warp per head.
    for (int h = warp; h < n_rep; h += kShortWarps) {
        float* p = ps + h * kShortKeys;
        float mx = -INFINITY;
        for (int j = lane; j < nk; j += kWarp) mx = fmaxf(mx, p[j]);
        mx = warp_max(mx);
        float l = 0.f;
        for (int j = lane; j < nk; j += kWarp) {
            const float x = exp2f(p[j] - mx);
            p[j] = x;
            l += x;
        }
        l = warp_sum(l);
        if (lane == 0) {
            ms[h] = mx;
            ls[h] = l;
        }
    }
    __syncthreads();
    // P V, unnormalized: a thread per (q head, dim), four independent sums over the keys.
    for (int e = threadIdx.x; e < n_rep * HD; e += kShortThreads) {
        const float* p = ps + (e / HD) * kShortKeys;
        const __half* v = vs + e % HD;
        float o[4] = {0.f, 0.f, 0.f, 0.f};
        int j = 0;
        for (; j + 4 <= nk; j += 4)
#pragma unroll
            for (int u = 0; u < 4; ++u) o[u] = fmaf(p[j + u], __half2float(v[(j + u) * kRow]), o[u]);
        for (; j < nk; ++j) o[0] = fmaf(p[j], __half2float(v[j * kRow]), o[0]);
        os[e] = (o[0] + o[1]) + (o[2] + o[3]);
    }
    const int64_t out0 = (int64_t(t) * a.n_head + int64_t(kvh) * n_rep) * HD;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (n_split > 1) {
        // Each CTA of the cluster finishes every n_split-th run of kShortThreads outputs from all
        // the partials (an empty key range has max -inf and adds nothing).
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();   // every partial written
        const float* rm[kShortMaxSplit];
        const float* rl[kShortMaxSplit];
        const float* ro[kShortMaxSplit];
#pragma unroll
        for (int r = 0; r < kShortMaxSplit; ++r)
            if (r < n_split) {
                rm[r] = cluster.map_shared_rank(ms, r);
                rl[r] = cluster.map_shared_rank(ls, r);
                ro[r] = cluster.map_shared_rank(os, r);
            }
        for (int e = int(cluster.block_rank()) * kShortThreads + threadIdx.x; e < n_rep * HD;
             e += n_split * kShortThreads) {
            const int h = e / HD;
            float mx = -INFINITY;
#pragma unroll
            for (int r = 0; r < kShortMaxSplit; ++r)
                if (r < n_split) mx = fmaxf(mx, rm[r][h]);
            float l = 0.f, o = 0.f;
#pragma unroll
            for (int r = 0; r < kShortMaxSplit; ++r)
                if (r < n_split) {
                    const float w = exp2f(rm[r][h] - mx);
                    l = fmaf(w, rl[r][h], l);
                    o = fmaf(w, ro[r][e], o);
                }
            store_out(a, out0 + e, o / (l + sink_term(a, int64_t(kvh) * n_rep + h, mx)));
        }
        cluster.sync();   // no CTA leaves while another reads its shared memory
        return;
    }
#endif
    __syncthreads();
    for (int e = threadIdx.x; e < n_rep * HD; e += kShortThreads) {
        const int h = e / HD;
        store_out(a, out0 + e, os[e] / (ls[h] + sink_term(a, int64_t(kvh) * n_rep + h, ms[h])));
    }
}

template <int HD>
bool launch_short(const AttentionArgs& a, const DeviceBatch& b, int n_split, cudaStream_t s) {
    const size_t smem = ShortSmem<HD>::bytes(a.n_head / a.n_head_kv);
    static size_t smem_set = 48 << 10;   // the opt-in above 48 KB, once per size
    if (smem > smem_set) {
        if (cudaFuncSetAttribute(attention_short_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) !=
            cudaSuccess) {
            cudaGetLastError();
            return false;   // more q heads a kv head than shared memory holds: another kernel takes it
        }
        smem_set = smem;
    }
    launch_pdl_cluster(attention_short_kernel<HD>, dim3(unsigned(n_split), unsigned(a.n_head_kv), unsigned(a.n_tok)),
                       dim3(kShortThreads), smem, unsigned(n_split), s, a, b);
    return true;
}

}  // namespace

bool attention_short(const AttentionArgs& a, const DeviceBatch& b, int32_t max_len, cudaStream_t s) {
    if (a.kv_q8 || max_len > kShortMaxLen || a.n_head_kv <= 0 || a.n_head % a.n_head_kv) return false;
    int n_split = 1;   // the fewest CTAs that give each at most kShortKeys keys
    while (n_split * kShortKeys < max_len) n_split *= 2;
    if (n_split > 1 && !device_is_sm90()) return false;
    if (a.n_tok == 0) return true;
    bool launched = false;
    switch (a.head_dim) {
        case 64: launched = launch_short<64>(a, b, n_split, s); break;
        case 128: launched = launch_short<128>(a, b, n_split, s); break;
        case 256: launched = launch_short<256>(a, b, n_split, s); break;
        default: return false;
    }
    if (launched) EMBER_CUDA_LAUNCHED("attention_short");
    return launched;
}

}  // namespace cuda
}  // namespace ember
