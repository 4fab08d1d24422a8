// The causal short convolution on the GPU: a thread per (channel, run of tokens). A call of one run
// (decode) carries the state in the same kernel, each thread its own channel; a longer prompt's
// runs read the old state in parallel, and a second kernel carries it once they are done.
#include "backend/short_conv.h"
#include "common.cuh"
#include "launch.h"
#include "short_conv.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kThreads = 64;   // channels of one CTA: a layer's few thousand channels fill the SMs
constexpr int kTokens = 32;    // tokens of one thread

// Row r of state-then-x for channel c.
__device__ __forceinline__ float conv_input(const float* x, const float* state, int32_t hist, int32_t channels,
                                            int32_t c, int32_t r) {
    return r < hist ? state[int64_t(r) * channels + c] : x[int64_t(r - hist) * channels + c];
}

// Row r of the new state is row n_tok + r of state-then-x: ahead of r, so in place in order.
__device__ __forceinline__ void carry(const float* x, float* state, int32_t n_tok, int32_t hist, int32_t channels,
                                      int32_t c) {
    for (int32_t r = 0; r < hist; ++r)
        state[int64_t(r) * channels + c] = conv_input(x, state, hist, channels, c, n_tok + r);
}

// Products and sums rounded one by one in the CPU's order (taps oldest first, then the bias) and
// the CPU's expf, so the outputs are the CPU's. carry_here: the grid has one run of tokens.
__global__ void __launch_bounds__(kThreads)
    short_conv_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                      int32_t n_tok, int32_t channels, int32_t kernel, bool silu, bool carry_here,
                      float* __restrict__ state, float* __restrict__ y) {
    const int32_t c = blockIdx.x * kThreads + threadIdx.x;
    const int32_t t0 = blockIdx.y * kTokens, t1 = min(n_tok, t0 + kTokens);
    pdl_wait();
    pdl_trigger();
    if (c >= channels) return;
    const int32_t hist = kernel - 1;
    const float* wc = w + int64_t(c) * kernel;
    const float b = bias ? bias[c] : 0.0f;
    for (int32_t t = t0; t < t1; ++t) {
        float sum = 0.0f;
        for (int32_t j = 0; j < kernel; ++j)
            sum = __fadd_rn(sum, __fmul_rn(wc[j], conv_input(x, state, hist, channels, c, t + j)));
        if (bias) sum = __fadd_rn(sum, b);
        if (silu) sum = __fdiv_rn(sum, __fadd_rn(1.0f, expf_glibc(-sum)));
        y[int64_t(t) * channels + c] = sum;
    }
    if (carry_here) carry(x, state, n_tok, hist, channels, c);
}

__global__ void __launch_bounds__(kThreads)
    carry_state_kernel(const float* __restrict__ x, int32_t n_tok, int32_t channels, int32_t kernel,
                       float* __restrict__ state) {
    const int32_t c = blockIdx.x * kThreads + threadIdx.x;
    pdl_wait();
    pdl_trigger();
    if (c < channels) carry(x, state, n_tok, kernel - 1, channels, c);
}

}  // namespace

void short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels, int32_t kernel,
                bool silu, float* state, float* y, cudaStream_t s) {
    check_short_conv(n_tok, channels, kernel, "cuda short_conv");
    if (n_tok == 0) return;
    const unsigned runs = unsigned((n_tok + kTokens - 1) / kTokens),
                   blocks = unsigned((channels + kThreads - 1) / kThreads);
    launch_pdl(short_conv_kernel, dim3(blocks, runs), dim3(kThreads), s, x, w, bias, n_tok, channels, kernel, silu,
               runs == 1, state, y);
    EMBER_CUDA_LAUNCHED("short_conv");
    if (runs == 1) return;
    launch_pdl(carry_state_kernel, dim3(blocks), dim3(kThreads), s, x, n_tok, channels, kernel, state);
    EMBER_CUDA_LAUNCHED("short_conv carry");
}

}  // namespace cuda
}  // namespace ember
