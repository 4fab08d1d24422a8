// The CPU's causal short convolution (Backend::short_conv): channel ranges on the pool, each
// range's tokens in order, then its part of the carried state.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/isa_kernels.h"

namespace ember {

namespace {

// Channels [c0, c1) of every token. Each output is the same sum in the same order however the
// tokens are split over calls (taps oldest first, then the bias), so a prompt in one call and its
// tokens one by one agree in every bit; the loops run along channels, which vectorize. SiLU is
// the gated activation's with an up of ones: its SIMD form has the scalar bits, times 1 is exact.
void conv_channels(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels, int32_t kernel,
                   GatedActFn silu, const float* state, int64_t c0, int64_t c1, float* y) {
    const int32_t hist = kernel - 1;
    const int64_t width = c1 - c0;
    // Tap j of channel c, gathered [kernel][width] so every tap is one contiguous row.
    std::vector<float> taps((size_t)kernel * width);
    for (int64_t c = c0; c < c1; ++c)
        for (int32_t j = 0; j < kernel; ++j) taps[(size_t)j * width + (c - c0)] = w[c * kernel + j];
    const std::vector<float> ones(silu ? (size_t)width : 0, 1.0f);
    for (int32_t t = 0; t < n_tok; ++t) {
        float* out = y + (int64_t)t * channels + c0;
        std::fill(out, out + width, 0.0f);
        for (int32_t j = 0; j < kernel; ++j) {
            const int32_t r = t + j;   // row of state-then-x
            const float* in = (r < hist ? state + (int64_t)r * channels : x + (int64_t)(r - hist) * channels) + c0;
            const float* tap = taps.data() + (size_t)j * width;
            for (int64_t i = 0; i < width; ++i) out[i] += tap[i] * in[i];
        }
        if (bias)
            for (int64_t i = 0; i < width; ++i) out[i] += bias[c0 + i];
        if (silu) silu(Activation::SiLU, out, ones.data(), width, out);
    }
}

// The state becomes the last kernel - 1 rows of state-then-x, channels [c0, c1): row r of the new
// state is row n_tok + r of the old sequence, which lies ahead of r, so rows move in place in order.
void carry_state(const float* x, int32_t n_tok, int32_t channels, int32_t kernel, int64_t c0, int64_t c1,
                 float* state) {
    const int32_t hist = kernel - 1;
    const size_t bytes = (size_t)(c1 - c0) * sizeof(float);
    for (int32_t r = 0; r < hist; ++r) {
        const int32_t src = n_tok + r;
        const float* from = (src < hist ? state + (int64_t)src * channels : x + (int64_t)(src - hist) * channels) + c0;
        std::memmove(state + (int64_t)r * channels + c0, from, bytes);
    }
}

}  // namespace

void CpuBackend::short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels,
                            int32_t kernel, bool silu, float* state, float* y) {
    check_short_conv(n_tok, channels, kernel, "cpu short_conv");
    if (n_tok == 0) return;
    const GatedActFn act = !silu ? nullptr : gated_act_kernel(simd_);
    // Ranges of whole cache lines, enough of them to share a prompt's work; a decode token's few
    // thousand multiply-adds stay on one thread.
    const int64_t grain = std::max<int64_t>(64, ((int64_t)1 << 16) / ((int64_t)n_tok * kernel) / 16 * 16);
    pool_.parallel_for(channels, grain, [&](int64_t c0, int64_t c1) {
        conv_channels(x, w, bias, n_tok, channels, kernel, act, state, c0, c1, y);
        carry_state(x, n_tok, channels, kernel, c0, c1, state);
    });
}

}  // namespace ember
