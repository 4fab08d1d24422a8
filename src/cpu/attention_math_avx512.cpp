// The attention arithmetic on AVX-512 (one zmm per 16-float vector): attention_math_simd.h
// built under this file's ISA flags.
#include "cpu/attention_math_simd.h"

namespace ember {

const AttentionMath kAttentionMathAvx512{
    attention_simd::scores,           attention_simd::scale_round, attention_simd::weighted_sum,
    attention_simd::weighted_sum_f16, attention_simd::f16_to_f32,  attention_simd::f32_to_f16,
    attention_simd::exp_shifted,      attention_simd::max,         attention_simd::gather_keys16_f16};

}  // namespace ember
