// The mixture's down expert GEMVs: a chunk's rows weighted by their routing weights, and the
// one-token path's down projection that sums a token's experts in one warp (moe_gemv.cuh).
#include "moe_gemv.cuh"

namespace ember {
namespace cuda {

namespace {

struct DownLaunch {
    MoeDownArgs a;
    int32_t units;
};

template <class F, int NT, int kDepth>
__global__ void __launch_bounds__(kMoeRows * kWarp) moe_down_kernel(DownLaunch l) {
    const MoeDownArgs& a = l.a;
    const int lane = threadIdx.x & (kWarp - 1);
    const int64_t row = int64_t(blockIdx.x) * kMoeRows + (threadIdx.x >> 5);
    pdl_wait();
    pdl_trigger();
    const MoeChunk c = a.chunks[blockIdx.y];
    const int64_t n_embd = a.down.n_out;
    if (c.expert < 0 || row >= n_embd) return;
    const GemvParams p[1] = {expert_params(a.down, l.units, c.expert, a.h, a.hq, a.hds, c.first)};
    float acc[1][NT] = {};
    warp_rows_dot<F, NT, 1, kDepth>(p, row, acc);
    const float b = a.down_bias ? a.down_bias[c.expert * n_embd + row] : 0.f;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float v = warp_sum(acc[0][t]);
        if (lane == t && t < c.count) {
            const int64_t i = int64_t(c.first) + t;
            a.y[i * n_embd + row] = __fmul_rn(a.weights[a.sorted[i]], __fadd_rn(v, b));
        }
    }
}

struct DownSumLaunch {
    MoeDownSumArgs a;
    int32_t units;
};

// One warp an output row of one token: the token's n_used experts' units laid end to end over the
// lanes, so a short row (a 768-wide Q4_K row is 12 units) still keeps every lane loading, and all
// the experts' loads are in flight together.
template <class F>
__global__ void __launch_bounds__(kMoeRows * kWarp) moe_down_sum_kernel(DownSumLaunch l) {
    constexpr int kDepth = F::kDepth;
    const MoeDownSumArgs& a = l.a;
    const int lane = threadIdx.x & (kWarp - 1);
    const int t = blockIdx.y;
    const int64_t row = int64_t(blockIdx.x) * kMoeRows + (threadIdx.x >> 5);
    pdl_wait();
    pdl_trigger();
    const int64_t n_embd = a.down.n_out;
    if (row >= n_embd) return;
    const int32_t units = l.units, n_items = a.n_used * units;
    const int32_t* ids = a.ids + t * a.n_used;
    const float* wts = a.weights + t * a.n_used;
    auto params = [&](int k) {
        return expert_params(a.down, units, ids[k], a.h, a.hq, a.hds, int64_t(t) * a.n_used + k);
    };
    float acc = 0.f;
    for (int i0 = lane; i0 < n_items; i0 += kDepth * kWarp) {
        typename F::Data v[kDepth];
#pragma unroll
        for (int j = 0; j < kDepth; ++j) {
            const int i = i0 + j * kWarp;
            if (i < n_items) v[j] = F::load(params(i / units), row, i % units);
        }
#pragma unroll
        for (int j = 0; j < kDepth; ++j) {
            const int i = i0 + j * kWarp;
            if (i >= n_items) continue;
            const int k = i / units;
            float part = 0.f;
            F::template dot<1>(params(k), i % units, v[j], &part);
            acc += wts[k] * part;
        }
    }
    acc = warp_sum(acc);
    if (lane != 0) return;
    if (a.down_bias)
        for (int k = 0; k < a.n_used; ++k) acc += wts[k] * a.down_bias[ids[k] * n_embd + row];
    float v = acc;
    const int64_t o = int64_t(t) * n_embd + row;
    if (a.shared) {
        const float s = a.shared_logit ? 1.f / (1.f + expf_glibc(-a.shared_logit[t])) : 1.f;
        v = __fadd_rn(v, __fmul_rn(s, a.shared[o]));
    }
    a.out[o] = v;
}

}  // namespace

void moe_down(const MoeDownArgs& a, int32_t n_chunks, int32_t chunk_tok, cudaStream_t s) {
    const DownLaunch l{a, expert_units(a.down)};
    const dim3 grid = chunk_grid(a.down.n_out, n_chunks, "moe_down");
    with_format(a.down.type, "moe_down", [&](auto f) {
        using F = decltype(f);
        with_chunk_tok(chunk_tok, "moe_down", [&](auto nt) {
            constexpr int kNT = decltype(nt)::value;
            if (l.units <= kWarp) launch_pdl(moe_down_kernel<F, kNT, 1>, grid, dim3(kMoeRows * kWarp), s, l);
            else launch_pdl(moe_down_kernel<F, kNT, F::kDepth>, grid, dim3(kMoeRows * kWarp), s, l);
        });
    });
    EMBER_CUDA_LAUNCHED("moe_down");
}

void moe_down_sum(const MoeDownSumArgs& a, int32_t n_tok, cudaStream_t s) {
    if (n_tok <= 0) return;
    const DownSumLaunch l{a, expert_units(a.down)};
    const dim3 grid = chunk_grid(a.down.n_out, n_tok, "moe_down_sum");
    with_format(a.down.type, "moe_down_sum",
                [&](auto f) { launch_pdl(moe_down_sum_kernel<decltype(f)>, grid, dim3(kMoeRows * kWarp), s, l); });
    EMBER_CUDA_LAUNCHED("moe_down_sum");
}

}  // namespace cuda
}  // namespace ember
