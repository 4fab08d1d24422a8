// The greedy choice, one rule for every place that makes it (the sampler, the backends'
// argmax_rows): the first highest logit's id, or -1 when every logit is -inf or NaN (NaN never
// wins a comparison).
#pragma once
#include <cstdint>
#include <limits>

namespace ember {

inline int32_t greedy_token(const float* logits, int64_t n) {
    int32_t best = -1;
    float best_logit = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i)
        if (logits[i] > best_logit) {
            best_logit = logits[i];
            best = (int32_t)i;
        }
    return best;
}

}  // namespace ember
