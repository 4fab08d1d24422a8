// The gated delta rule on the GPU: the exact token-by-token recurrence, one warp per (v head, 32
// state columns). Each column of a head's state evolves on its own given the token's q, k, g and
// beta, so a lane owns one column in shared memory and the tokens need no reduction across lanes.
#include "common.cuh"
#include "delta_rule.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kCols = kWarp;   // state columns of one CTA, one per lane

// Lane `lane` holds column j = blockIdx.y * kCols + lane of head h's state in S[i * kCols + lane].
// q and k rows are staged in shared memory, normalized there as the CPU does (products rounded
// to the normalized value before use).
__global__ void __launch_bounds__(kCols)
    gated_delta_rule_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                            const float* __restrict__ g, const float* __restrict__ beta, int32_t n_tok,
                            DeltaRuleShape s, float* __restrict__ state, float* __restrict__ out) {
    extern __shared__ float smem[];
    const int32_t hk = s.head_k, hv = s.head_v, h = blockIdx.x, kh = h % s.n_k_heads;
    const int lane = threadIdx.x, j = blockIdx.y * kCols + lane;
    const bool live = j < hv;
    float* S = smem;                   // [hk][kCols]
    float* qn = S + hk * kCols;        // [hk]
    float* kn = qn + hk;               // [hk]
    const int64_t qk_row = int64_t(s.n_k_heads) * hk, v_row = int64_t(s.n_v_heads) * hv;
    float* Sg = state + int64_t(h) * hk * hv;
    pdl_wait();
    pdl_trigger();
    for (int32_t i = 0; i < hk; ++i) S[i * kCols + lane] = live ? Sg[int64_t(i) * hv + j] : 0.0f;
    const float q_scale = 1.0f / sqrtf(float(hk));
    for (int32_t t = 0; t < n_tok; ++t) {
        const float* qt = q + t * qk_row + int64_t(kh) * hk;
        const float* kt = k + t * qk_row + int64_t(kh) * hk;
        float sq = 0.0f, sk = 0.0f;
        for (int32_t i = lane; i < hk; i += kCols) {
            const float a = qt[i], b = kt[i];
            qn[i] = a;
            kn[i] = b;
            sq += a * a;
            sk += b * b;
        }
        const float mq = q_scale / sqrtf(warp_sum(sq) + kDeltaRuleNormEps);
        const float mk = 1.0f / sqrtf(warp_sum(sk) + kDeltaRuleNormEps);
        for (int32_t i = lane; i < hk; i += kCols) {
            qn[i] *= mq;
            kn[i] *= mk;
        }
        __syncwarp();
        const float decay = expf_glibc(g[int64_t(t) * s.n_v_heads + h]);
        const float b = beta[int64_t(t) * s.n_v_heads + h];
        float kv = 0.0f;
        for (int32_t i = 0; i < hk; ++i) {
            const float x = S[i * kCols + lane] * decay;
            S[i * kCols + lane] = x;
            kv += x * kn[i];
        }
        const float delta = b * ((live ? v[t * v_row + int64_t(h) * hv + j] : 0.0f) - kv);
        float o = 0.0f;
        for (int32_t i = 0; i < hk; ++i) {
            const float x = S[i * kCols + lane] + kn[i] * delta;
            S[i * kCols + lane] = x;
            o += x * qn[i];
        }
        if (live) out[t * v_row + int64_t(h) * hv + j] = o;
        __syncwarp();   // every lane is done with qn, kn before the next token's land there
    }
    if (live)
        for (int32_t i = 0; i < hk; ++i) Sg[int64_t(i) * hv + j] = S[i * kCols + lane];
}

}  // namespace

void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int32_t n_tok,
                      const DeltaRuleShape& shape, float* state, float* out, cudaStream_t s) {
    check_delta_rule_shape(shape, n_tok, "cuda gated_delta_rule");
    if (shape.head_k > kDeltaRuleMaxHeadK)
        fail("cuda gated_delta_rule: head_k ", shape.head_k, " over ", kDeltaRuleMaxHeadK);
    if (n_tok == 0) return;
    const dim3 grid(unsigned(shape.n_v_heads), unsigned((shape.head_v + kCols - 1) / kCols));
    const size_t smem = size_t(shape.head_k) * (kCols + 2) * sizeof(float);
    launch_pdl_smem(gated_delta_rule_kernel, grid, dim3(kCols), smem, s, q, k, v, g, beta, n_tok, shape, state, out);
    EMBER_CUDA_LAUNCHED("gated_delta_rule");
}

}  // namespace cuda
}  // namespace ember
