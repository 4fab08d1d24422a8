// The legacy 32-element weight kinds that the SIMD kernels specialize on, with their block
// types and traits (shared by vec_dot_avx2/avx512 and gemm_avx2/avx512). IQ4_NL, Q4_0's layout
// through a table of signed values, is one of them for the batch tiles only (its dot is
// vec_dot's dot_table, whose integer lanes and float steps are the legacy dots').
#pragma once
#include "ember/quant.h"
#include "quant/blocks.h"

namespace ember {

enum class Legacy { q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl };

// clang-format off: one row a type
template <Legacy K> struct LegacyBlocks;
template <> struct LegacyBlocks<Legacy::q4_0> { using W = BlockQ4_0; using X = BlockQ8_0; static constexpr GGMLType type = GGMLType::Q4_0; };
template <> struct LegacyBlocks<Legacy::q4_1> { using W = BlockQ4_1; using X = BlockQ8_1; static constexpr GGMLType type = GGMLType::Q4_1; };
template <> struct LegacyBlocks<Legacy::q5_0> { using W = BlockQ5_0; using X = BlockQ8_0; static constexpr GGMLType type = GGMLType::Q5_0; };
template <> struct LegacyBlocks<Legacy::q5_1> { using W = BlockQ5_1; using X = BlockQ8_1; static constexpr GGMLType type = GGMLType::Q5_1; };
template <> struct LegacyBlocks<Legacy::q8_0> { using W = BlockQ8_0; using X = BlockQ8_0; static constexpr GGMLType type = GGMLType::Q8_0; };
template <> struct LegacyBlocks<Legacy::iq4_nl> { using W = BlockIQ4_NL; using X = BlockQ8_0; static constexpr GGMLType type = GGMLType::IQ4_NL; };
// clang-format on

template <Legacy K>
constexpr bool kHasMin = K == Legacy::q4_1 || K == Legacy::q5_1;   // d * q + m
template <Legacy K>
constexpr bool kQ5 = K == Legacy::q5_0 || K == Legacy::q5_1;
template <Legacy K>
constexpr bool kSignedWeights = !kHasMin<K>;   // q - offset (or int8)

}  // namespace ember
