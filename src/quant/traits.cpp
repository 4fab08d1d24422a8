// The type traits table: type -> block geometry and the scalar dequantize/quantize of its format.
#include <vector>

#include "ember/status.h"
#include "quant/kernels.h"

namespace ember {
namespace {

const std::vector<TypeTraits>& table() {
    using T = GGMLType;
    static const std::vector<TypeTraits> rows = {
        {T::F32, "F32", 1, 4, dequantize_row_f32, quantize_row_f32},
        {T::F16, "F16", 1, 2, dequantize_row_f16, quantize_row_f16},
        {T::BF16, "BF16", 1, 2, dequantize_row_bf16, quantize_row_bf16},
        {T::Q4_0, "Q4_0", 32, 18, dequantize_row_q4_0, quantize_row_q4_0},
        {T::Q4_1, "Q4_1", 32, 20, dequantize_row_q4_1, quantize_row_q4_1},
        {T::Q5_0, "Q5_0", 32, 22, dequantize_row_q5_0, quantize_row_q5_0},
        {T::Q5_1, "Q5_1", 32, 24, dequantize_row_q5_1, quantize_row_q5_1},
        {T::Q8_0, "Q8_0", 32, 34, dequantize_row_q8_0, quantize_row_q8_0},
        {T::Q8_1, "Q8_1", 32, 36, dequantize_row_q8_1, quantize_row_q8_1},
        {T::Q2_K, "Q2_K", 256, 84, dequantize_row_q2_k, quantize_row_q2_k},
        {T::Q3_K, "Q3_K", 256, 110, dequantize_row_q3_k, quantize_row_q3_k},
        {T::Q4_K, "Q4_K", 256, 144, dequantize_row_q4_k, quantize_row_q4_k},
        {T::Q5_K, "Q5_K", 256, 176, dequantize_row_q5_k, quantize_row_q5_k},
        {T::Q6_K, "Q6_K", 256, 210, dequantize_row_q6_k, quantize_row_q6_k},
        {T::Q8_K, "Q8_K", 256, 292, dequantize_row_q8_k, quantize_row_q8_k},
        {T::IQ4_NL, "IQ4_NL", 32, 18, dequantize_row_iq4_nl, quantize_row_iq4_nl},
        {T::IQ4_XS, "IQ4_XS", 256, 136, dequantize_row_iq4_xs, quantize_row_iq4_xs},
        {T::IQ3_S, "IQ3_S", 256, 110, dequantize_row_iq3_s, nullptr},
        {T::IQ3_XXS, "IQ3_XXS", 256, 98, dequantize_row_iq3_xxs, nullptr},
        {T::IQ2_XXS, "IQ2_XXS", 256, 66, dequantize_row_iq2_xxs, nullptr},
        {T::IQ2_XS, "IQ2_XS", 256, 74, dequantize_row_iq2_xs, nullptr},
        {T::IQ2_S, "IQ2_S", 256, 82, dequantize_row_iq2_s, nullptr},
        {T::IQ1_S, "IQ1_S", 256, 50, dequantize_row_iq1_s, nullptr},
        {T::IQ1_M, "IQ1_M", 256, 56, dequantize_row_iq1_m, nullptr},
        {T::TQ1_0, "TQ1_0", 256, 54, dequantize_row_tq1_0, quantize_row_tq1_0},
        {T::TQ2_0, "TQ2_0", 256, 66, dequantize_row_tq2_0, quantize_row_tq2_0},
        {T::MXFP4, "MXFP4", 32, 17, dequantize_row_mxfp4, quantize_row_mxfp4},
        {T::NVFP4, "NVFP4", 64, 36, dequantize_row_nvfp4, nullptr},
    };
    return rows;
}

}  // namespace

const TypeTraits* find_type_traits(uint32_t type_id) {
    for (const TypeTraits& t : table()) {
        if (uint32_t(t.type) == type_id) return &t;
    }
    return nullptr;
}

const TypeTraits& type_traits(GGMLType type) {
    const TypeTraits* t = find_type_traits(uint32_t(type));
    if (!t) fail("quant: unknown or unsupported ggml type id ", uint32_t(type));
    return *t;
}

size_t row_bytes(GGMLType type, int64_t n) {
    const TypeTraits& t = type_traits(type);
    if (n < 0 || n % t.block_elems != 0) {
        fail("quant: row of ", n, " elements is not a whole number of ", t.name, " blocks (", t.block_elems,
             " elements each)");
    }
    return size_t(n / t.block_elems) * size_t(t.block_bytes);
}

}  // namespace ember
