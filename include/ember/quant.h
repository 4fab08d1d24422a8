// Tensor element types and their block formats: one traits table (type -> block size, bytes,
// scalar dequantize/quantize), and the fp16/bf16 conversions. Kernels live with each backend.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ember {

// Numeric values are GGML's (they are stored in GGUF tensor infos).
// clang-format off: a table of GGML's ids, kept packed
enum class GGMLType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40,
};
// clang-format on

using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);

struct TypeTraits {
    GGMLType type;
    const char* name;
    int block_elems;       // elements per block
    int block_bytes;       // bytes per block
    DequantizeRowFn dequantize_row;   // scalar reference (ground truth)
    QuantizeRowFn quantize_row;       // scalar reference; nullptr where not supported
};

// nullptr for a type id ember does not know.
const TypeTraits* find_type_traits(uint32_t type_id);
// Throws InvalidInput for unknown types.
const TypeTraits& type_traits(GGMLType type);
// Bytes of a row of n elements; throws if n is not a whole number of blocks.
size_t row_bytes(GGMLType type, int64_t n);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

}  // namespace ember
