// The shape of Backend::gated_delta_rule (the gated DeltaNet layers of Qwen3.5 and Qwen3-Next) and
// the check every backend makes of it.
#pragma once
#include <cstdint>

#include "ember/status.h"

namespace ember {

struct DeltaRuleShape {
    int32_t n_k_heads = 0;   // heads of q and k
    int32_t n_v_heads = 0;   // heads of v, the state and the output: a multiple of n_k_heads
    int32_t head_k = 0;      // width of a q or k head (rows of a head's state)
    int32_t head_v = 0;      // width of a v head (columns of a head's state)
};

// The L2 norm of q and k adds this under the square root (transformers' and the FLA kernels' l2norm).
constexpr float kDeltaRuleNormEps = 1e-6f;

inline void check_delta_rule_shape(const DeltaRuleShape& s, int32_t n_tok, const char* who) {
    if (n_tok < 0) fail(who, ": n_tok must be >= 0, got ", n_tok);
    if (s.n_k_heads <= 0 || s.n_v_heads <= 0 || s.head_k <= 0 || s.head_v <= 0)
        fail(who, ": heads and head widths must be positive, got n_k_heads ", s.n_k_heads, ", n_v_heads ", s.n_v_heads,
             ", head_k ", s.head_k, ", head_v ", s.head_v);
    if (s.n_v_heads % s.n_k_heads != 0)
        fail(who, ": n_v_heads ", s.n_v_heads, " must be a multiple of n_k_heads ", s.n_k_heads);
}

}  // namespace ember
