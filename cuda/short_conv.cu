// The causal short convolution on the GPU: a thread per channel runs its tokens in order and then
// carries its channel's state, so no thread reads a state row another one writes.
#include "backend/short_conv.h"
#include "common.cuh"
#include "launch.h"
#include "short_conv.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kThreads = 64;   // channels of one CTA: a layer's few thousand channels fill the SMs

// Products and sums rounded one by one in the CPU's order (taps oldest first, then the bias) and
// the CPU's expf, so the outputs are the CPU's.
__global__ void __launch_bounds__(kThreads)
    short_conv_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                      int32_t n_tok, int32_t channels, int32_t kernel, bool silu, float* __restrict__ state,
                      float* __restrict__ y) {
    const int32_t c = blockIdx.x * kThreads + threadIdx.x;
    pdl_wait();
    pdl_trigger();
    if (c >= channels) return;
    const int32_t hist = kernel - 1;
    const float* wc = w + int64_t(c) * kernel;
    auto in = [&](int32_t r) {   // row r of state-then-x, this channel
        return r < hist ? state[int64_t(r) * channels + c] : x[int64_t(r - hist) * channels + c];
    };
    const float b = bias ? bias[c] : 0.0f;
    for (int32_t t = 0; t < n_tok; ++t) {
        float sum = 0.0f;
        for (int32_t j = 0; j < kernel; ++j) sum = __fadd_rn(sum, __fmul_rn(wc[j], in(t + j)));
        if (bias) sum = __fadd_rn(sum, b);
        if (silu) sum = __fdiv_rn(sum, __fadd_rn(1.0f, expf_glibc(-sum)));
        y[int64_t(t) * channels + c] = sum;
    }
    // Row r of the new state is row n_tok + r of state-then-x: ahead of r, so in place in order.
    for (int32_t r = 0; r < hist; ++r) state[int64_t(r) * channels + c] = in(n_tok + r);
}

}  // namespace

void short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels, int32_t kernel,
                bool silu, float* state, float* y, cudaStream_t s) {
    check_short_conv(n_tok, channels, kernel, "cuda short_conv");
    if (n_tok == 0) return;
    const dim3 grid(unsigned((channels + kThreads - 1) / kThreads));
    launch_pdl(short_conv_kernel, grid, dim3(kThreads), s, x, w, bias, n_tok, channels, kernel, silu, state, y);
    EMBER_CUDA_LAUNCHED("short_conv");
}

}  // namespace cuda
}  // namespace ember
