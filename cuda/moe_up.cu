// The mixture's gate and up expert GEMVs: a chunk of one expert's rows, the biases and the activation
// applied as h is written (moe_gemv.cuh).
#include "moe_gemv.cuh"

namespace ember {
namespace cuda {

namespace {

struct UpLaunch {
    MoeUpArgs a;
    int32_t units;
};

template <class F, int NT, Activation A, int kDepth>
__global__ void __launch_bounds__(kMoeRows * kWarp) moe_up_kernel(UpLaunch l) {
    const MoeUpArgs& a = l.a;
    const int lane = threadIdx.x & (kWarp - 1);
    const int64_t row = int64_t(blockIdx.x) * kMoeRows + (threadIdx.x >> 5);
    pdl_wait();   // the chunks and x come from the kernels before
    pdl_trigger();
    const MoeChunk c = a.chunks[blockIdx.y];
    const int64_t n_ff = a.gate.n_out;
    if (c.expert < 0 || row >= n_ff) return;
    const GemvParams p[2] = {expert_params(a.gate, l.units, c.expert, a.x, a.xq, a.xds, c.xrow),
                             expert_params(a.up, l.units, c.expert, a.x, a.xq, a.xds, c.xrow)};
    float acc[2][NT] = {};
    warp_rows_dot<F, NT, 2, kDepth>(p, row, acc);
    const float gb = a.gate_bias ? a.gate_bias[c.expert * n_ff + row] : 0.f;
    const float ub = a.up_bias ? a.up_bias[c.expert * n_ff + row] : 0.f;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float g = warp_sum(acc[0][t]), u = warp_sum(acc[1][t]);
        if (lane == t && t < c.count)
            a.h[(int64_t(c.first) + t) * n_ff + row] = gated<A>(__fadd_rn(g, gb), __fadd_rn(u, ub));
    }
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
                constexpr int kNT = decltype(nt)::value;
                constexpr Activation kA = decltype(act)::value;
                if (l.units <= kWarp) launch_pdl(moe_up_kernel<F, kNT, kA, 1>, grid, dim3(kMoeRows * kWarp), s, l);
                else launch_pdl(moe_up_kernel<F, kNT, kA, F::kDepth>, grid, dim3(kMoeRows * kWarp), s, l);
            });
        });
    });
    EMBER_CUDA_LAUNCHED("moe_up");
}

}  // namespace cuda
}  // namespace ember
