// Launchers of the encoders' kernels (encoder_ops.cu): LayerNorm, the non-gated activations and
// bidirectional attention over the packed sequences of a batch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
#include "kernels.h"

namespace ember {
namespace cuda {

// Heads up to this size: each lane of attention's warps holds head_dim / 32 of a query's sums.
constexpr int kEncoderMaxHeadDim = 256;

void layernorm(const float* x, const float* gamma, const float* beta, int32_t n_tok, int32_t dim, float eps, float* y,
               cudaStream_t s);
void unary(UnaryOp f, float* x, int64_t n, cudaStream_t s);
// Sequences as the batch mirror's seq says (a sequence's tokens contiguous); window as
// Backend::encoder_attention's.
void encoder_attention(const float* q, const float* k, const float* v, int32_t n_tok, int32_t n_head, int32_t n_head_kv,
                       int32_t head_dim, float scale, int32_t window, const DeviceBatch& b, float* out, cudaStream_t s);

}  // namespace cuda
}  // namespace ember
