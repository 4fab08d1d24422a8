// Launcher of the causal short convolution's kernel (short_conv.cu), Backend::short_conv on the GPU.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ember {
namespace cuda {

// As Backend::short_conv: state [kernel - 1][channels] updated in place, all in device memory.
void short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels, int32_t kernel,
                bool silu, float* state, float* y, cudaStream_t s);

}  // namespace cuda
}  // namespace ember
