// The shape of Backend::ssm_scan (Mamba2's selective state space layers: Nemotron-H, Granite 4),
// the check every backend makes of it, and the size of its per-sequence state.
#pragma once
#include <cstdint>

#include "ember/status.h"

namespace ember {

struct SsmShape {
    int32_t n_head = 0;     // heads of x, dt, the state and y
    int32_t head_dim = 0;   // width of an x head (rows of a head's state)
    int32_t d_state = 0;    // width of a B or C group (columns of a head's state)
    int32_t n_group = 0;    // groups of B and C; head h reads group h / (n_head / n_group)

    // constexpr: the GPU's kernels call them too.
    constexpr int64_t inner() const { return (int64_t)n_head * head_dim; }
    // One token's row of xbc: x [inner()], then B and C [n_group * d_state] each, as Mamba2's
    // convolution leaves them.
    constexpr int64_t xbc_width() const { return inner() + 2 * (int64_t)n_group * d_state; }
};

// Floats of one sequence's state: [n_head][head_dim][d_state].
inline int64_t ssm_state_floats(const SsmShape& s) { return s.inner() * s.d_state; }

// softplus(x) = log(1 + exp(x)), and x itself past 20 where the two agree in float (torch's and
// ggml's threshold), so that large steps do not overflow.
constexpr float kSoftplusThreshold = 20.0f;

inline void check_ssm_shape(const SsmShape& s, int32_t n_tok, const char* who) {
    if (n_tok < 0) fail(who, ": n_tok must be >= 0, got ", n_tok);
    if (s.n_head <= 0 || s.head_dim <= 0 || s.d_state <= 0 || s.n_group <= 0)
        fail(who, ": heads, widths and groups must be positive, got n_head ", s.n_head, ", head_dim ", s.head_dim,
             ", d_state ", s.d_state, ", n_group ", s.n_group);
    if (s.n_head % s.n_group != 0) fail(who, ": n_head ", s.n_head, " must be a multiple of n_group ", s.n_group);
}

}  // namespace ember
