// Mamba2's grouped RMS norm on the GPU: a warp per group of a row, its sum of squares in double as
// the CPU backend sums it (the groups are short, a few hundred elements).
#include "common.cuh"
#include "ember/status.h"
#include "launch.h"
#include "rmsnorm_grouped.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kGroupWarps = 4;   // groups (warps) of one CTA

__global__ void __launch_bounds__(kGroupWarps* kWarp)
    rmsnorm_grouped_kernel(const float* x, const float* __restrict__ gamma, int64_t n_groups_total, int32_t n_groups,
                           int64_t group, float eps, float* y) {
    const int64_t r = int64_t(blockIdx.x) * kGroupWarps + threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    pdl_wait();
    pdl_trigger();
    if (r >= n_groups_total) return;
    const float* xr = x + r * group;
    const float* g = gamma + (r % n_groups) * group;
    float* yr = y + r * group;
    double ss = 0.0;
    for (int64_t i = lane; i < group; i += kWarp) ss += double(xr[i]) * double(xr[i]);
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float scale = float(1.0 / sqrt(ss / double(group) + double(eps)));
    for (int64_t i = lane; i < group; i += kWarp) yr[i] = xr[i] * scale * g[i];
}

}  // namespace

void rmsnorm_grouped(const float* x, const float* gamma, int32_t n_rows, int64_t width, int32_t n_groups, float eps,
                     float* y, cudaStream_t s) {
    if (n_rows < 0 || n_groups <= 0 || width <= 0 || width % n_groups != 0)
        fail("cuda rmsnorm_grouped: width ", width, " must be a positive multiple of n_groups ", n_groups, ", n_rows ",
             n_rows, " not negative");
    const int64_t total = int64_t(n_rows) * n_groups;
    if (total == 0) return;
    launch_pdl(rmsnorm_grouped_kernel, unsigned((total + kGroupWarps - 1) / kGroupWarps), kGroupWarps * kWarp, s, x,
               gamma, total, n_groups, width / n_groups, eps, y);
    EMBER_CUDA_LAUNCHED("rmsnorm_grouped");
}

}  // namespace cuda
}  // namespace ember
