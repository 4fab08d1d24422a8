// Activation quantization for vec_dot: float rows -> the weight type's vec_dot_type.
#include "quant/activation.h"

#include "ember/status.h"

namespace ember {

size_t activation_bytes(GGMLType vec_dot_type, int64_t n) { return row_bytes(vec_dot_type, n); }

void quantize_activations(GGMLType vec_dot_type, const float* x, void* dst, int64_t n) {
    const TypeTraits& t = type_traits(vec_dot_type);
    row_bytes(vec_dot_type, n);   // validates n
    if (!t.quantize_row) fail("quant: no quantizer for activation type ", t.name);
    t.quantize_row_best(x, dst, n);
}

}  // namespace ember
