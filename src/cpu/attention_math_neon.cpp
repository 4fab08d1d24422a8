// The attention arithmetic on ARM64 NEON (four q registers per 16-float vector):
// attention_math_simd.h, built with -ffp-contract=off like every attention_math file, so a
// multiply and an add never fuse and it returns the scalar's bits. Elsewhere kAttentionMathNeon
// is the scalar table (never chosen: the level is neon on ARM64 only).
#include "cpu/attention_math.h"

#if defined(__aarch64__)
#include "cpu/attention_math_simd.h"

namespace ember {

const AttentionMath kAttentionMathNeon{
    attention_simd::scores,           attention_simd::scale_round, attention_simd::weighted_sum,
    attention_simd::weighted_sum_f16, attention_simd::f16_to_f32,  attention_simd::f32_to_f16,
    attention_simd::exp_shifted,      attention_simd::max,         attention_simd::gather_keys16_f16};

}  // namespace ember
#else
namespace ember {
const AttentionMath kAttentionMathNeon = kAttentionMathScalar;
}  // namespace ember
#endif
