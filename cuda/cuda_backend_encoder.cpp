// The CUDA backend's encoder ops: LayerNorm, the non-gated activations and bidirectional attention
// over the batch's packed sequences (the kernels in encoder_ops.cu).
#include "cuda_backend_impl.h"
#include "encoder_kernels.h"

namespace ember {
namespace cuda {

void CudaBackend::layernorm(const float* x, const float* gamma, const float* beta, int32_t n_tok, int32_t dim,
                            float eps, float* y) {
    issue_uploads();
    cuda::layernorm(x, gamma, beta, n_tok, dim, eps, y, stream_);
}

void CudaBackend::unary(UnaryOp f, float* x, int64_t n) {
    issue_uploads();
    cuda::unary(f, x, n, stream_);
}

void CudaBackend::encoder_attention(const float* q, const float* k, const float* v, int32_t n_tok,
                                    const AttentionShape& shape, float* out) {
    check_batch(n_tok, "encoder_attention");
    const int32_t H = shape.n_head, Hkv = shape.n_head_kv, D = shape.head_dim;
    if (H <= 0 || Hkv <= 0 || H % Hkv != 0 || D <= 0)
        fail("cuda encoder_attention: n_head ", H, " must be a positive multiple of n_head_kv ", Hkv, ", head_dim ", D);
    if (D > kEncoderMaxHeadDim) fail("cuda encoder_attention: head_dim ", D, " over ", kEncoderMaxHeadDim);
    if (shape.sinks || shape.softcap > 0.0f || shape.chunk != 0)
        fail("encoder_attention takes no attention sinks, soft-capping or chunks");
    if (shape.window < 0) fail("encoder_attention: window must be >= 0, got ", shape.window);
    issue_uploads();
    cuda::encoder_attention(q, k, v, n_tok, H, Hkv, D, shape.scale, shape.window, dbatch_, out, stream_);
}

}  // namespace cuda
}  // namespace ember
