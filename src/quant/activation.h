// Conversion of float activations to a weight type's vec_dot_type, for the matmul: one row
// of n floats -> activation_bytes(type, n) bytes that traits.vec_dot reads.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ember/quant.h"

namespace ember {

// Bytes needed for n activations in vec_dot_type (throws if n is not a whole number of blocks).
size_t activation_bytes(GGMLType vec_dot_type, int64_t n);
// x[n] float -> dst in vec_dot_type (F32: a copy). Throws for types without a quantizer.
void quantize_activations(GGMLType vec_dot_type, const float* x, void* dst, int64_t n);

}  // namespace ember
