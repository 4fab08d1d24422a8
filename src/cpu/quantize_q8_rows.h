// Row loops of the SIMD activation quantizers (quantize_avx2.cpp, quantize_avx512.cpp) around
// their one-block kernel Block(x, q, &sum): it writes 32 int8 values and their sum and returns
// d = amax / 127, or a negative value for a block the scalar quantizer must take (NaN, inf).
// Each kernel lives in its own file's anonymous namespace, so every instantiation is its own.
#pragma once
#include <cstdint>
#include <type_traits>

#include "cpu/isa_kernels.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/kernels.h"

namespace ember {

using Q8BlockFn = float (*)(const float* x, int8_t* q, int* sum);

// Q8_0, or Q8_1 with s = d * sum(q) as well.
template <Q8BlockFn Block, class B>
void quantize_rows(const float* src, void* dst, int64_t n) {
    constexpr bool kQ8_1 = std::is_same<B, BlockQ8_1>::value;
    B* b = static_cast<B*>(dst);
    for (int64_t i = 0; i < n / QK8_0; ++i, src += QK8_0) {   // QK8_1 == QK8_0
        int sum;
        const float d = Block(src, b[i].qs, &sum);
        if (d < 0) {
            (kQ8_1 ? quantize_row_q8_1 : quantize_row_q8_0)(src, &b[i], QK8_0);
            continue;
        }
        b[i].d = float_to_half(d);
        if constexpr (kQ8_1) b[i].s = float_to_half(float(sum) * d);
    }
}

// The quantizer of `type` built on Block; nullptr for the types it does not cover.
template <Q8BlockFn Block>
QuantizeRowFn q8_row_quantizer(GGMLType type) {
    switch (type) {
        case GGMLType::Q8_0: return quantize_rows<Block, BlockQ8_0>;
        case GGMLType::Q8_1: return quantize_rows<Block, BlockQ8_1>;
        default: return nullptr;
    }
}

}  // namespace ember
