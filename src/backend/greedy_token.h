// The greedy choice, one rule for every place that makes it (the sampler, the backends'
// argmax_rows, a grammar's masked greedy step): the first highest logit's id, or -1 when every
// logit is -inf or NaN (NaN never wins a comparison).
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

// greedy_token over the ids whose bit is set in mask (bit i % 32 of word i / 32; ids past the mask
// are refused), without writing -inf into a copy of the row: a grammar's greedy step reads only
// the allowed logits, and whole zero words (most of the vocabulary, inside JSON) cost one test.
inline int32_t greedy_token_masked(const float* logits, int64_t n, const uint32_t* mask, int64_t n_words) {
    int32_t best = -1;
    float best_logit = -std::numeric_limits<float>::infinity();
    const int64_t words = n_words < (n + 31) / 32 ? n_words : (n + 31) / 32;
    for (int64_t w = 0; w < words; ++w)
        for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
            const int64_t i = w * 32 + __builtin_ctz(bits);
            if (i < n && logits[i] > best_logit) {
                best_logit = logits[i];
                best = (int32_t)i;
            }
        }
    return best;
}

}  // namespace ember
