// Decode GEMV: y [n_tok][n_out] = x [n_tok][n_in] * W^T for n_tok <= 8, every weight type.
// One warp per output row; its lanes stride over the row's units (gemv_formats.cuh) so a
// warp's 16-byte loads are contiguous, and all n_tok tokens share each weight load.
#include "common.cuh"
#include "gemv_formats.cuh"
#include "kernels.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kRowsPerBlock = 4;   // warps per block

template <class F, int NT>
__global__ void __launch_bounds__(kRowsPerBlock * kWarp) gemv_kernel(GemvParams p) {
    const int lane = threadIdx.x & (kWarp - 1);
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    if (row >= p.n_out) return;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;
#pragma unroll 2
    for (int u = lane; u < p.units; u += kWarp) F::template dot<NT>(p, row, u, acc);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) p.y[t * p.n_out + row] = v;
    }
}

template <class F>
void launch(const GemvParams& p, int32_t n_tok, cudaStream_t s) {
    const dim3 grid(unsigned((p.n_out + kRowsPerBlock - 1) / kRowsPerBlock)), block(kRowsPerBlock * kWarp);
    switch (n_tok) {
        case 1: gemv_kernel<F, 1><<<grid, block, 0, s>>>(p); break;
        case 2: gemv_kernel<F, 2><<<grid, block, 0, s>>>(p); break;
        case 3: gemv_kernel<F, 3><<<grid, block, 0, s>>>(p); break;
        case 4: gemv_kernel<F, 4><<<grid, block, 0, s>>>(p); break;
        case 5: gemv_kernel<F, 5><<<grid, block, 0, s>>>(p); break;
        case 6: gemv_kernel<F, 6><<<grid, block, 0, s>>>(p); break;
        case 7: gemv_kernel<F, 7><<<grid, block, 0, s>>>(p); break;
        case 8: gemv_kernel<F, 8><<<grid, block, 0, s>>>(p); break;
        default: fail("cuda gemv: n_tok ", n_tok, " is outside 1..", kMaxGemvTokens);
    }
    EMBER_CUDA_LAUNCHED("gemv");
}

}  // namespace

bool gemv_wants_q8(GGMLType type) {
    return !(type == GGMLType::F32 || type == GGMLType::F16 || type == GGMLType::BF16);
}

void gemv(const DeviceWeight& w, const float* x, const int8_t* xq, const float2* xds,
          int32_t n_tok, float* y, cudaStream_t s) {
    GemvParams p;
    p.w = w.base;
    p.meta = w.base + w.layout.meta_off;
    p.meta2 = w.base + w.layout.meta2_off;
    p.n_in = w.n_in;
    p.n_out = w.n_out;
    p.n_blocks = w.layout.n_blocks;
    p.x = x;
    p.xq = xq;
    p.xds = xds;
    p.y = y;
    const int64_t nb = w.layout.n_blocks;
    switch (w.type) {
        case GGMLType::Q4_0: p.units = int32_t(nb); launch<FmtQ4_0>(p, n_tok, s); break;
        case GGMLType::Q4_1: p.units = int32_t(nb); launch<FmtQ4_1>(p, n_tok, s); break;
        case GGMLType::Q5_0: p.units = int32_t(nb); launch<FmtQ5<false>>(p, n_tok, s); break;
        case GGMLType::Q5_1: p.units = int32_t(nb); launch<FmtQ5<true>>(p, n_tok, s); break;
        case GGMLType::Q8_0: p.units = int32_t(nb); launch<FmtQ8_0>(p, n_tok, s); break;
        case GGMLType::Q4_K: p.units = int32_t(nb * 4); launch<FmtQK<false>>(p, n_tok, s); break;
        case GGMLType::Q5_K: p.units = int32_t(nb * 4); launch<FmtQK<true>>(p, n_tok, s); break;
        case GGMLType::Q6_K: p.units = int32_t(nb * 4); launch<FmtQ6_K>(p, n_tok, s); break;
        case GGMLType::F32: p.units = int32_t(w.n_in / 4); launch<FmtFloat<float>>(p, n_tok, s); break;
        case GGMLType::F16: p.units = int32_t(w.n_in / 8); launch<FmtFloat<__half>>(p, n_tok, s); break;
        case GGMLType::BF16: p.units = int32_t(w.n_in / 8); launch<FmtFloat<__nv_bfloat16>>(p, n_tok, s); break;
        default: fail("cuda gemv: unsupported weight type ", block_info(w.type).name);
    }
}

}  // namespace cuda
}  // namespace ember
