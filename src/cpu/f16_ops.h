// f16 vector kernels used by attention over an f16 KV cache (dot with an f32 vector, scaled add).
// They keep a fixed sequential summation order on every CPU: model outputs are compared with
// llama.cpp's token for token, and a changed rounding order flips 8-bit activation rounding
// downstream (measured: up to 0.3 logits at the first position), so speed comes from a
// conversion table instead of SIMD reordering.
#pragma once
#include <cstdint>

namespace ember {

float f16_dot(const float* a, const uint16_t* b, int n);        // sum a[i] * b[i], in order
void f16_axpy(float w, const uint16_t* x, float* y, int n);     // y[i] += w * x[i]

}  // namespace ember
