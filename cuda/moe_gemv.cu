// The mixture's expert GEMVs over the decode GEMV's formats (gemv_formats.cuh, each type through its
// BlockDecoder): gate and up of a chunk of one expert's rows with the activation applied as they are
// written, the chunk's down projection weighted by the routing weight, and the one-token path's
// down projection that sums a token's experts in one warp. The expert id comes from device memory
// (the routing kernels), so nothing waits for the host and a step can be captured as a graph.
#include <type_traits>

#include "gated_act.cuh"
#include "gemv_formats.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kRows = 4;   // warps a CTA, one output row each

// The units a lane strides over in one of the experts' rows (as gemv.cu's row_units).
int32_t expert_units(const MoeExperts& w) {
    switch (w.type) {
        case GGMLType::Q4_K:
        case GGMLType::Q5_K:
        case GGMLType::Q6_K: return int32_t(w.layout.n_blocks * 4);
        case GGMLType::F32: return int32_t(w.n_in / 4);
        case GGMLType::F16:
        case GGMLType::BF16: return int32_t(w.n_in / 8);
        default: return int32_t(w.layout.n_blocks);
    }
}

// GemvParams for expert e of w reading x rows from xrow on.
__device__ __forceinline__ GemvParams expert_params(const MoeExperts& w, int32_t units, int e, const float* x,
                                                    const int8_t* xq, const float2* xds, int64_t xrow) {
    GemvParams p;
    p.w = w.base + size_t(e) * w.stride;
    p.meta = p.w + w.layout.meta_off;
    p.meta2 = p.w + w.layout.meta2_off;
    p.n_in = w.n_in;
    p.n_out = w.n_out;
    p.n_blocks = w.layout.n_blocks;
    p.units = units;
    p.x = x ? x + xrow * w.n_in : nullptr;
    p.xq = xq ? xq + xrow * w.n_in : nullptr;
    p.xds = xds ? xds + xrow * (w.n_in / 32) : nullptr;
    p.y = nullptr;
    return p;
}

// acc[r] += row `row` of p[r] . x over the warp's lanes (not yet summed over them); F::kDepth units
// a lane in flight for every weight.
template <class F, int NT, int R>
__device__ __forceinline__ void warp_rows_dot(const GemvParams (&p)[R], int64_t row, float (&acc)[R][NT]) {
    constexpr int kDepth = F::kDepth;
    const int lane = threadIdx.x & (kWarp - 1), units = p[0].units;
    for (int u0 = lane; u0 < units; u0 += kDepth * kWarp) {
        typename F::Data v[R][kDepth];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int k = 0; k < kDepth; ++k)
                if (u0 + k * kWarp < units) v[r][k] = F::load(p[r], row, u0 + k * kWarp);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int k = 0; k < kDepth; ++k)
                if (u0 + k * kWarp < units) F::template dot<NT>(p[r], u0 + k * kWarp, v[r][k], acc[r]);
    }
}

struct UpLaunch {
    MoeUpArgs a;
    int32_t units;
};

template <class F, int NT, Activation A>
__global__ void __launch_bounds__(kRows * kWarp) moe_up_kernel(UpLaunch l) {
    const MoeUpArgs& a = l.a;
    const int lane = threadIdx.x & (kWarp - 1);
    const int64_t row = int64_t(blockIdx.x) * kRows + (threadIdx.x >> 5);
    pdl_wait();   // the chunks and x come from the kernels before
    pdl_trigger();
    const MoeChunk c = a.chunks[blockIdx.y];
    const int64_t n_ff = a.gate.n_out;
    if (c.expert < 0 || row >= n_ff) return;
    const GemvParams p[2] = {expert_params(a.gate, l.units, c.expert, a.x, a.xq, a.xds, c.xrow),
                             expert_params(a.up, l.units, c.expert, a.x, a.xq, a.xds, c.xrow)};
    float acc[2][NT] = {};
    warp_rows_dot<F, NT, 2>(p, row, acc);
    const float gb = a.gate_bias ? a.gate_bias[c.expert * n_ff + row] : 0.f;
    const float ub = a.up_bias ? a.up_bias[c.expert * n_ff + row] : 0.f;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float g = warp_sum(acc[0][t]), u = warp_sum(acc[1][t]);
        if (lane == t && t < c.count)
            a.h[(int64_t(c.first) + t) * n_ff + row] = gated<A>(__fadd_rn(g, gb), __fadd_rn(u, ub));
    }
}

struct DownLaunch {
    MoeDownArgs a;
    int32_t units;
};

template <class F, int NT>
__global__ void __launch_bounds__(kRows * kWarp) moe_down_kernel(DownLaunch l) {
    const MoeDownArgs& a = l.a;
    const int lane = threadIdx.x & (kWarp - 1);
    const int64_t row = int64_t(blockIdx.x) * kRows + (threadIdx.x >> 5);
    pdl_wait();
    pdl_trigger();
    const MoeChunk c = a.chunks[blockIdx.y];
    const int64_t n_embd = a.down.n_out;
    if (c.expert < 0 || row >= n_embd) return;
    const GemvParams p[1] = {expert_params(a.down, l.units, c.expert, a.h, a.hq, a.hds, c.first)};
    float acc[1][NT] = {};
    warp_rows_dot<F, NT, 1>(p, row, acc);
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
__global__ void __launch_bounds__(kRows * kWarp) moe_down_sum_kernel(DownSumLaunch l) {
    constexpr int kDepth = F::kDepth;
    const MoeDownSumArgs& a = l.a;
    const int lane = threadIdx.x & (kWarp - 1);
    const int t = blockIdx.y;
    const int64_t row = int64_t(blockIdx.x) * kRows + (threadIdx.x >> 5);
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

// Calls f(F{}) with the GEMV format of a type (gemv_formats.cuh); the 32-element formats in the
// lane-strided order (expert rows need not keep the CPU's order).
template <class Fn>
void with_format(GGMLType type, const char* op, Fn&& f) {
    switch (type) {
        case GGMLType::Q4_0: return f(FmtBlock32<DecodeQ4_0>{});
        case GGMLType::Q4_1: return f(FmtBlock32<DecodeQ4_1>{});
        case GGMLType::Q5_0: return f(FmtBlock32<DecodeQ5_0>{});
        case GGMLType::Q5_1: return f(FmtBlock32<DecodeQ5_1>{});
        case GGMLType::Q8_0: return f(FmtBlock32<DecodeQ8_0>{});
        case GGMLType::Q4_K: return f(FmtQK<false>{});
        case GGMLType::Q5_K: return f(FmtQK<true>{});
        case GGMLType::Q6_K: return f(FmtQ6_K{});
        case GGMLType::F32: return f(FmtFloat<float>{});
        case GGMLType::F16: return f(FmtFloat<__half>{});
        case GGMLType::BF16: return f(FmtFloat<__nv_bfloat16>{});
        default: fail("cuda ", op, ": unsupported expert type ", block_info(type).name);
    }
}

template <class Fn>
void with_chunk_tok(int32_t chunk_tok, const char* op, Fn&& f) {
    if (chunk_tok == 1) return f(std::integral_constant<int, 1>{});
    if (chunk_tok == kMaxGemvTokens) return f(std::integral_constant<int, kMaxGemvTokens>{});
    fail("cuda ", op, ": chunks of ", chunk_tok, " tokens (1 or ", kMaxGemvTokens, ")");
}

dim3 chunk_grid(int64_t n_rows, int32_t n_chunks, const char* op) {
    if (n_chunks < 1 || n_chunks > 65535) fail("cuda ", op, ": ", n_chunks, " chunks (1..65535)");
    return dim3(unsigned((n_rows + kRows - 1) / kRows), unsigned(n_chunks));
}

}  // namespace

void moe_up(const MoeUpArgs& a, int32_t n_chunks, int32_t chunk_tok, cudaStream_t s) {
    if (a.gate.type != a.up.type || a.gate.n_in != a.up.n_in || a.gate.n_out != a.up.n_out)
        fail("cuda moe_up: gate and up experts differ in type or shape");
    const UpLaunch l{a, expert_units(a.gate)};
    const dim3 grid = chunk_grid(a.gate.n_out, n_chunks, "moe_up");
    with_format(a.gate.type, "moe_up", [&](auto f) {
        using F = decltype(f);
        with_chunk_tok(chunk_tok, "moe_up", [&](auto nt) {
            with_activation(a.act, [&](auto act) {
                launch_pdl(moe_up_kernel<F, decltype(nt)::value, decltype(act)::value>, grid, dim3(kRows * kWarp), s,
                           l);
            });
        });
    });
    EMBER_CUDA_LAUNCHED("moe_up");
}

void moe_down(const MoeDownArgs& a, int32_t n_chunks, int32_t chunk_tok, cudaStream_t s) {
    const DownLaunch l{a, expert_units(a.down)};
    const dim3 grid = chunk_grid(a.down.n_out, n_chunks, "moe_down");
    with_format(a.down.type, "moe_down", [&](auto f) {
        using F = decltype(f);
        with_chunk_tok(chunk_tok, "moe_down", [&](auto nt) {
            launch_pdl(moe_down_kernel<F, decltype(nt)::value>, grid, dim3(kRows * kWarp), s, l);
        });
    });
    EMBER_CUDA_LAUNCHED("moe_down");
}

void moe_down_sum(const MoeDownSumArgs& a, int32_t n_tok, cudaStream_t s) {
    if (n_tok <= 0) return;
    const DownSumLaunch l{a, expert_units(a.down)};
    const dim3 grid = chunk_grid(a.down.n_out, n_tok, "moe_down_sum");
    with_format(a.down.type, "moe_down_sum",
                [&](auto f) { launch_pdl(moe_down_sum_kernel<decltype(f)>, grid, dim3(kRows * kWarp), s, l); });
    EMBER_CUDA_LAUNCHED("moe_down_sum");
}

}  // namespace cuda
}  // namespace ember
