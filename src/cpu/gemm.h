// Tiled quantized matmul kernels for batches (n_tok > 1): each decodes a weight block once for
// several tokens, and reproduces the runtime vec_dot kernel it stands in for bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ember/quant.h"

namespace ember {

// y[t * n_out + o] = dot(n_in, w + o * w_row, x + t * x_row) for o in [o_begin, o_end) and
// every t < n_tok, where x holds the activations already quantized to the vec_dot type.
using GemmFn = void (*)(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x,
                        size_t x_row, int32_t n_tok, int64_t o_begin, int64_t o_end, float* y,
                        int64_t n_out);

// The tiled kernel whose every output equals what `dot` returns, or nullptr when there is
// none for that kernel (the caller then loops over dot). Matching on the function pointer
// keeps the choice tied to the vec_dot the traits table picked (EMBER_SIMD included).
GemmFn gemm_avx512_for(VecDotFn dot);
GemmFn gemm_avx2_for(VecDotFn dot);
inline GemmFn gemm_for(VecDotFn dot) {
    const GemmFn f = gemm_avx512_for(dot);
    return f ? f : gemm_avx2_for(dot);
}

}  // namespace ember
