// Mamba2's selective scan on the GPU: the exact token-by-token recurrence, a warp per row of a
// head's state. A row evolves on its own given the token's x, dt, B and C, so its lanes keep its
// columns in registers over the tokens and meet only in the sum of each token's output.
#include "common.cuh"
#include "launch.h"
#include "ssm_scan.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kRows = 4;                          // state rows (warps) of one CTA
constexpr int kPerLane = kSsmMaxDState / kWarp;   // state columns a lane holds

__global__ void __launch_bounds__(kRows* kWarp)
    ssm_scan_kernel(const float* __restrict__ xbc, const float* __restrict__ dt, const float* __restrict__ A,
                    const float* __restrict__ dt_bias, const float* __restrict__ D, int32_t n_tok, SsmShape s,
                    float* __restrict__ state, float* __restrict__ y) {
    const int32_t h = blockIdx.x, i = blockIdx.y * kRows + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    pdl_wait();
    pdl_trigger();
    if (i >= s.head_dim) return;
    const int32_t ds = s.d_state, g = h / (s.n_head / s.n_group);
    const int64_t inner = s.inner(), width = s.xbc_width();
    float* row = state + (int64_t(h) * s.head_dim + i) * ds;
    float S[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        const int32_t j = lane + k * kWarp;
        S[k] = j < ds ? row[j] : 0.0f;
    }
    const float a = A[h], bias = dt_bias ? dt_bias[h] : 0.0f, skip = D ? D[h] : 0.0f;
    for (int32_t t = 0; t < n_tok; ++t) {
        const float* tok = xbc + t * width;
        const float* b = tok + inner + int64_t(g) * ds;
        const float* c = b + int64_t(s.n_group) * ds;
        const float x = tok[int64_t(h) * s.head_dim + i];
        const float z = dt[int64_t(t) * s.n_head + h] + bias;
        const float d = z > kSoftplusThreshold ? z : log1pf(expf_glibc(z));
        const float decay = expf_glibc(d * a), x_dt = x * d;
        float part = 0.0f;
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) {
            const int32_t j = lane + k * kWarp;
            if (j < ds) {
                S[k] = S[k] * decay + b[j] * x_dt;
                part += S[k] * c[j];
            }
        }
        const float sum = warp_sum(part);
        if (lane == 0) y[t * inner + int64_t(h) * s.head_dim + i] = D ? sum + skip * x : sum;
    }
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        const int32_t j = lane + k * kWarp;
        if (j < ds) row[j] = S[k];
    }
}

}  // namespace

void ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D, int32_t n_tok,
              const SsmShape& shape, float* state, float* y, cudaStream_t s) {
    check_ssm_shape(shape, n_tok, "cuda ssm_scan");
    if (shape.d_state > kSsmMaxDState) fail("cuda ssm_scan: d_state ", shape.d_state, " over ", kSsmMaxDState);
    if (n_tok == 0) return;
    const dim3 grid(unsigned(shape.n_head), unsigned((shape.head_dim + kRows - 1) / kRows));
    launch_pdl(ssm_scan_kernel, grid, dim3(kRows * kWarp), s, xbc, dt, A, dt_bias, D, n_tok, shape, state, y);
    EMBER_CUDA_LAUNCHED("ssm_scan");
}

}  // namespace cuda
}  // namespace ember
