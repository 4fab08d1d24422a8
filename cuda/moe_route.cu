// A mixture's bookkeeping kernels: routing (top-k of the router's logits), the grouping of a batch's
// (token, expert) rows by expert, row gathers, the weighted sum of a token's experts, and the
// scatter-add and sigmoid primitives of the default composition.
#include <climits>

#include "common.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

// Whether (v, i) ranks before (bv, bi): the higher score, ties to the lower index; bi < 0 is none.
__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi) {
    return bi < 0 || v > bv || (v == bv && i < bi);
}

// Group-limited choice (MoeRouteArgs::n_group > 1), by lane 0 as the CPU's limit_to_best_groups: a
// softmax's scores become probabilities first (the groups add them up), each group is scored by the sum of
// its two best choice scores, and the experts outside the n_group_used best groups (ties to the lower
// index) can no longer be chosen. Returns whether the scores are probabilities now.
__device__ bool limit_to_best_groups(const MoeRouteArgs& a, float* choose, float* score) {
    __shared__ float group[kMoeMaxGroups];
    __shared__ bool kept[kMoeMaxGroups];
    const int n = a.n_expert, per = n / a.n_group;
    const bool normalize = a.gating == MoeGating::softmax;
    if (normalize) {
        float sum = 0.f;
        for (int i = 0; i < n; ++i) sum = __fadd_rn(sum, score[i]);
        for (int i = 0; i < n; ++i) choose[i] = score[i] = __fdiv_rn(score[i], sum);
    }
    for (int g = 0; g < a.n_group; ++g) {
        const float* c = choose + g * per;
        float best = -INFINITY, second = -INFINITY;
        for (int i = 0; i < per; ++i) {
            if (c[i] > best) second = best, best = c[i];
            else if (c[i] > second) second = c[i];
        }
        group[g] = per > 1 ? __fadd_rn(best, second) : best;
        kept[g] = false;
    }
    for (int j = 0; j < a.n_group_used; ++j) {
        int bg = -1;
        for (int g = 0; g < a.n_group; ++g)
            if (!kept[g] && (bg < 0 || group[g] > group[bg])) bg = g;
        kept[bg] = true;
    }
    for (int g = 0; g < a.n_group; ++g)
        if (!kept[g])
            for (int i = 0; i < per; ++i) choose[g * per + i] = -INFINITY;
    return normalize;
}

// One warp a token. The scores go through shared memory; lane 0 sums them in expert order and
// weighs the chosen ones as the CPU does, so the weights are the CPU's bits.
__global__ void moe_route_kernel(MoeRouteArgs a) {
    extern __shared__ float smem[];
    float* choose = smem;                 // [n_expert] the score an expert is chosen by
    float* score = smem + a.n_expert;     // [n_expert] its weight before the top-k
    int* chosen = reinterpret_cast<int*>(score + a.n_expert);   // [n_used]
    float* w = reinterpret_cast<float*>(chosen + a.n_used);     // [n_used]
    unsigned char* taken = reinterpret_cast<unsigned char*>(w + a.n_used);   // [n_expert]
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x, lane = threadIdx.x, n = a.n_expert, k = a.n_used;
    const float* l = a.logits + int64_t(t) * n;
    float m = -INFINITY;
    for (int i = lane; i < n; i += kWarp) {
        const float v = a.router_bias ? __fadd_rn(l[i], a.router_bias[i]) : l[i];
        choose[i] = v;
        taken[i] = 0;
        m = fmaxf(m, v);
        if (a.gating == MoeGating::sigmoid) {
            const float s = 1.f / (1.f + expf_glibc(-v));
            score[i] = s;
            choose[i] = a.selection_bias ? __fadd_rn(s, a.selection_bias[i]) : s;
        }
    }
    m = warp_max(m);
    // softmax: the exps here, their sum (in expert order) by lane 0 below; only the chosen few
    // are divided by it.
    if (a.gating == MoeGating::softmax)
        for (int i = lane; i < n; i += kWarp) score[i] = expf_glibc(__fsub_rn(choose[i], m));
    __syncwarp();
    bool probabilities = false;
    if (a.n_group > 1) {
        if (lane == 0) probabilities = limit_to_best_groups(a, choose, score);
        probabilities = __shfl_sync(0xffffffffu, probabilities, 0);
        __syncwarp();
    }
    for (int j = 0; j < k; ++j) {
        float bv = 0.f;
        int bi = -1;
        for (int i = lane; i < n; i += kWarp)
            if (!taken[i] && ranks_before(choose[i], i, bv, bi)) bv = choose[i], bi = i;
        for (int o = kWarp / 2; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && ranks_before(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (lane == 0) {
            chosen[j] = bi;
            taken[bi] = 1;
        }
        __syncwarp();
    }
    if (lane != 0) return;
    if (a.gating == MoeGating::topk_softmax) {
        const float top = choose[chosen[0]];
        float sum = 0.f;
        for (int j = 0; j < k; ++j) sum = __fadd_rn(sum, w[j] = expf_glibc(__fsub_rn(choose[chosen[j]], top)));
        for (int j = 0; j < k; ++j) w[j] = __fdiv_rn(w[j], sum);
    } else if (a.gating == MoeGating::softmax && !probabilities) {
        float sum = 0.f;
        for (int i = 0; i < n; ++i) sum = __fadd_rn(sum, score[i]);
        for (int j = 0; j < k; ++j) w[j] = __fdiv_rn(score[chosen[j]], sum);
    } else {
        for (int j = 0; j < k; ++j) w[j] = score[chosen[j]];
    }
    if (a.norm_topk) {
        float sum = 0.f;
        for (int j = 0; j < k; ++j) sum = __fadd_rn(sum, w[j]);
        for (int j = 0; j < k; ++j) w[j] = __fdiv_rn(w[j], sum);
    }
    for (int j = 0; j < k; ++j) w[j] = __fmul_rn(w[j], a.weight_scale);
    if (a.ascending)   // insertion sort of the few chosen by expert id
        for (int j = 1; j < k; ++j)
            for (int q = j; q > 0 && chosen[q - 1] > chosen[q]; --q) {
                const int ti = chosen[q];
                chosen[q] = chosen[q - 1];
                chosen[q - 1] = ti;
                const float tw = w[q];
                w[q] = w[q - 1];
                w[q - 1] = tw;
            }
    for (int j = 0; j < k; ++j) {
        const int r = t * k + j;
        a.ids[r] = chosen[j];
        a.weights[r] = w[j];
        if (a.chunks) a.chunks[r] = MoeChunk{chosen[j], r, 1, t};
    }
}

// One CTA: counts per expert in shared memory, offsets and chunk starts by one thread (a few
// hundred experts), then every row placed with an atomic slot of its expert. The order within an
// expert's rows varies from run to run; no row's result depends on it.
__global__ void moe_group_kernel(const int32_t* __restrict__ ids, int32_t rows, int32_t n_expert, int32_t chunk_tok,
                                 int32_t* __restrict__ sorted, int32_t* __restrict__ pos, MoeChunk* __restrict__ chunks,
                                 int32_t max_chunks) {
    extern __shared__ int32_t sh[];
    int32_t* count = sh;                  // [n_expert], then the fill of each
    int32_t* start = sh + n_expert;       // [n_expert]
    int32_t* cstart = sh + 2 * n_expert;  // [n_expert + 1]
    pdl_wait();
    pdl_trigger();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) atomicAdd(&count[ids[r]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t at = 0, c = 0;
        for (int e = 0; e < n_expert; ++e) {
            start[e] = at;
            cstart[e] = c;
            at += count[e];
            c += (count[e] + chunk_tok - 1) / chunk_tok;
        }
        cstart[n_expert] = c;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        for (int32_t j = 0, c = cstart[e]; j < count[e]; j += chunk_tok, ++c)
            chunks[c] = MoeChunk{e, start[e] + j, min(chunk_tok, count[e] - j), start[e] + j};
        count[e] = 0;
    }
    for (int c = cstart[n_expert] + threadIdx.x; c < max_chunks; c += blockDim.x) chunks[c] = MoeChunk{-1, 0, 0, 0};
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const int e = ids[r];
        const int32_t at = start[e] + atomicAdd(&count[e], 1);
        sorted[at] = r;
        pos[r] = at;
    }
}

// One CTA a row, 16-byte words where the row allows, else 4-byte ones.
__global__ void gather_rows_kernel(const uint8_t* __restrict__ src, int64_t row_bytes, const int32_t* __restrict__ idx,
                                   int32_t div, uint8_t* __restrict__ dst) {
    pdl_wait();
    pdl_trigger();
    const int64_t r = blockIdx.x;
    const uint8_t* s = src + int64_t(idx[r] / div) * row_bytes;
    uint8_t* d = dst + r * row_bytes;
    if (row_bytes % 16 == 0 && (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 == 0) {
        for (int64_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x)
            reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
    } else {
        for (int64_t i = threadIdx.x; i < row_bytes / 4; i += blockDim.x)
            reinterpret_cast<uint32_t*>(d)[i] = reinterpret_cast<const uint32_t*>(s)[i];
    }
}

// The shared expert's term of a token's output, as the default composition adds it.
__device__ __forceinline__ float plus_shared(float v, const float* shared, const float* logit, int t, int64_t i) {
    if (!shared) return v;
    if (!logit) return __fadd_rn(v, shared[i]);
    const float s = 1.f / (1.f + expf_glibc(-logit[t]));
    return __fadd_rn(v, __fmul_rn(s, shared[i]));
}

__global__ void moe_combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ pos, int32_t n_used,
                                   int64_t n_embd, const float* __restrict__ shared,
                                   const float* __restrict__ shared_logit, float* __restrict__ out) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.y;
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n_embd; j += int64_t(gridDim.x) * blockDim.x) {
        float v = 0.f;
        for (int k = 0; k < n_used; ++k) v = __fadd_rn(v, y[int64_t(pos[t * n_used + k]) * n_embd + j]);
        out[int64_t(t) * n_embd + j] = plus_shared(v, shared, shared_logit, t, int64_t(t) * n_embd + j);
    }
}

__global__ void scatter_add_rows_kernel(float* __restrict__ out, const float* __restrict__ y,
                                        const int32_t* __restrict__ rows, const float* __restrict__ scale,
                                        int64_t dim) {
    pdl_wait();
    pdl_trigger();
    const int64_t r = blockIdx.y;
    float* o = out + int64_t(rows[r]) * dim;
    const float s = scale[r];
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < dim; j += int64_t(gridDim.x) * blockDim.x)
        o[j] = __fadd_rn(o[j], __fmul_rn(s, y[r * dim + j]));
}

__global__ void sigmoid_kernel(float* x, int64_t n) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] = 1.f / (1.f + expf_glibc(-x[i]));
}

unsigned row_ctas(int64_t n, int threads) {
    const int64_t g = (n + threads - 1) / threads;
    return unsigned(g < 64 ? (g > 0 ? g : 1) : 64);
}

}  // namespace

void moe_route(const MoeRouteArgs& a, cudaStream_t s) {
    if (a.n_tok <= 0) return;
    if (a.n_expert < 1 || a.n_used < 1 || a.n_used > a.n_expert)
        fail("cuda moe_route: ", a.n_used, " of ", a.n_expert, " experts");
    if (a.n_group > 1 && (a.n_group > kMoeMaxGroups || a.n_expert % a.n_group || a.n_group_used < 1 ||
                          a.n_group_used > a.n_group || a.n_used > a.n_group_used * (a.n_expert / a.n_group)))
        fail("cuda moe_route: ", a.n_group_used, " of ", a.n_group, " expert groups (at most ", kMoeMaxGroups,
             ", splitting ", a.n_expert, " experts evenly) cannot hold ", a.n_used, " chosen experts");
    const size_t smem = size_t(a.n_expert) * 9 + size_t(a.n_used) * 8;
    if (smem > 48 * 1024) fail("cuda moe_route: ", a.n_expert, " experts need more shared memory than a CTA has");
    launch_pdl_smem(moe_route_kernel, dim3(unsigned(a.n_tok)), dim3(kWarp), smem, s, a);
    EMBER_CUDA_LAUNCHED("moe_route");
}

void moe_group(const int32_t* ids, int32_t rows, int32_t n_expert, int32_t chunk_tok, int32_t* sorted, int32_t* pos,
               MoeChunk* chunks, int32_t max_chunks, cudaStream_t s) {
    if (n_expert < 1 || n_expert > kMoeMaxExperts)
        fail("cuda moe_group: ", n_expert, " experts (1..", kMoeMaxExperts, ")");
    const size_t smem = (size_t(3) * n_expert + 1) * sizeof(int32_t);
    launch_pdl_smem(moe_group_kernel, dim3(1), dim3(512), smem, s, ids, rows, n_expert, chunk_tok, sorted, pos, chunks,
                    max_chunks);
    EMBER_CUDA_LAUNCHED("moe_group");
}

void gather_rows_bytes(const void* src, int64_t row_bytes, const int32_t* idx, int32_t div, int32_t n_rows, void* dst,
                       cudaStream_t s) {
    if (n_rows <= 0) return;
    if (row_bytes % 4) fail("cuda gather_rows: rows of ", row_bytes, " bytes are not whole 4-byte words");
    launch_pdl(gather_rows_kernel, dim3(unsigned(n_rows)), dim3(128), s, static_cast<const uint8_t*>(src), row_bytes,
               idx, div, static_cast<uint8_t*>(dst));
    EMBER_CUDA_LAUNCHED("gather_rows");
}

void moe_combine(const float* y, const int32_t* pos, int32_t n_tok, int32_t n_used, int64_t n_embd, const float* shared,
                 const float* shared_logit, float* out, cudaStream_t s) {
    if (n_tok <= 0) return;
    launch_pdl(moe_combine_kernel, dim3(row_ctas(n_embd, 256), unsigned(n_tok)), dim3(256), s, y, pos, n_used, n_embd,
               shared, shared_logit, out);
    EMBER_CUDA_LAUNCHED("moe_combine");
}

void scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* scale, int32_t n_rows, int64_t dim,
                      cudaStream_t s) {
    if (n_rows <= 0 || dim <= 0) return;
    launch_pdl(scatter_add_rows_kernel, dim3(row_ctas(dim, 256), unsigned(n_rows)), dim3(256), s, out, y, rows, scale,
               dim);
    EMBER_CUDA_LAUNCHED("scatter_add_rows");
}

void sigmoid(float* x, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    const int64_t g = (n + 255) / 256;
    launch_pdl(sigmoid_kernel, dim3(unsigned(g < 65536 ? g : 65536)), dim3(256), s, x, n);
    EMBER_CUDA_LAUNCHED("sigmoid");
}

}  // namespace cuda
}  // namespace ember
