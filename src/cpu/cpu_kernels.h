// The CPU's kernels per tensor type: the format activations are quantized to for a dot product,
// the scalar reference dot, and the best dot and activation quantizer for this CPU (its SIMD
// level, chosen once, lowered by EMBER_SIMD).
#pragma once
#include <cstdint>

#include "ember/quant.h"

namespace ember {

// Dot product of n elements: a row of weights in one type with activations already quantized
// to that type's vec_dot_type.
using VecDotFn = float (*)(int64_t n, const void* w, const void* x);

struct CpuKernels {
    GGMLType vec_dot_type;            // format activations are converted to for vec_dot
    VecDotFn vec_dot_ref;             // scalar reference
    VecDotFn vec_dot;                 // best kernel for this CPU
    QuantizeRowFn quantize_row_best;  // best quantizer for this CPU, the bytes of the scalar
                                      // quantize_row; nullptr where the type has none
};

// Throws InvalidInput for types ember does not know.
const CpuKernels& cpu_kernels(GGMLType type);
// x[n] float -> dst in vec_dot_type (row_bytes(vec_dot_type, n) bytes; F32: a copy). Throws when n
// is not a whole number of blocks or the type has no quantizer.
void quantize_activations(GGMLType vec_dot_type, const float* x, void* dst, int64_t n);

// The SIMD level the kernels use: CPU features, lowered by EMBER_SIMD ("scalar", "avx2",
// "avx512"), read once per process.
// x86 levels are ordered (each has the one below); neon is ARM64's only level, ranked above them
// so that EMBER_SIMD=scalar still lowers it.
enum class SimdLevel { scalar = 0, avx2 = 1, avx512 = 2, neon = 3 };
SimdLevel cpu_simd_level();

}  // namespace ember
