// K-quantizers weighted by an importance per column (an importance matrix's mean squared
// activations, ember-quantize --imatrix): each element's rounding error counts in proportion.
#pragma once
#include <cstdint>

#include "ember/quant.h"

namespace ember {

// qw: n importances, one per element of the row (the row's columns).
using QuantizeRowWeightedFn = void (*)(const float* src, void* dst, int64_t n, const float* qw);

// The weighted quantizer of type t (Q4_K, Q5_K, Q6_K); nullptr for the others.
QuantizeRowWeightedFn weighted_quantizer(GGMLType t);

}  // namespace ember
