// The CPU's kernels per tensor type: the format activations are quantized to for a dot product,
// the scalar reference dot, and the best dot and activation quantizer at a SIMD level (the CPU's
// features, lowered by a backend's EMBER_SIMD switch).
#pragma once
#include <cstdint>

#include "backend/switches.h"
#include "ember/quant.h"

namespace ember {

// Dot product of n elements: a row of weights in one type with activations already quantized
// to that type's vec_dot_type.
using VecDotFn = float (*)(int64_t n, const void* w, const void* x);

// x86 levels are ordered (each has the one below); neon is ARM64's only level, ranked above them
// so that EMBER_SIMD=scalar still lowers it.
enum class SimdLevel { scalar = 0, avx2 = 1, avx512 = 2, neon = 3 };
// The best level this CPU's features allow.
SimdLevel detected_simd_level();
// The level a backend made with these switches uses: detected_simd_level(), lowered by EMBER_SIMD
// (to scalar, or on x86 to a lower x86 level; a level the CPU lacks leaves it as it is).
SimdLevel simd_level(const Switches& switches);
const char* simd_level_name(SimdLevel level);

struct CpuKernels {
    GGMLType vec_dot_type;            // format activations are converted to for vec_dot
    VecDotFn vec_dot_ref;             // scalar reference
    VecDotFn vec_dot;                 // best kernel at the level
    QuantizeRowFn quantize_row_best;  // best quantizer at the level, the bytes of the scalar
                                      // quantize_row; nullptr where the type has none
};

// Throws InvalidInput for types ember does not know.
const CpuKernels& cpu_kernels(GGMLType type, SimdLevel level);
// x[n] float -> dst in vec_dot_type (row_bytes(vec_dot_type, n) bytes; F32: a copy), by the level's
// quantizer. Throws when n is not a whole number of blocks or the type has no quantizer.
void quantize_activations(GGMLType vec_dot_type, const float* x, void* dst, int64_t n, SimdLevel level);

}  // namespace ember
