// Token sampling: greedy, temperature, top-k/typical/top-p/min-p, mirostat v1/v2,
// repeat/frequency/presence penalties, logit bias, seeded RNG (same seed -> same output).
#pragma once
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace ember {

struct SamplingParams {
    float temperature = 0.8f;      // finite; <= 0: greedy
    int32_t top_k = 40;            // <= 0: whole vocabulary
    float typical_p = 1.0f;        // locally typical sampling's mass; >= 1: off
    float top_p = 0.95f;           // >= 1: off
    float min_p = 0.05f;           // <= 0: off
    float repeat_penalty = 1.0f;   // llama.cpp style: divide positive logits, multiply negative
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    int32_t penalty_last_n = 64;   // window of recent tokens the penalties look at; -1 = all
    std::vector<std::pair<int32_t, float>> logit_bias;
    uint64_t seed = 0xFFFFFFFFu;
    // Mirostat (1 or 2; 0: off) replaces top_k/typical/top_p/min_p: it truncates to keep the
    // surprise of the drawn tokens near tau, learning at rate eta.
    int32_t mirostat = 0;
    float mirostat_tau = 5.0f;
    float mirostat_eta = 0.1f;
};

class Sampler {
public:
    // Throws InvalidInput naming the parameter that is out of range.
    explicit Sampler(const SamplingParams& params);
    // history: tokens so far (prompt + generated), for penalties. logits is not modified.
    // NaN logits (and those a -inf logit_bias bans) are never drawn; a +inf logit after bias and
    // penalties is a certainty (the lowest such id). Throws InvalidInput when no token can be drawn.
    int32_t sample(const float* logits, int32_t n_vocab, const std::vector<int32_t>& history);
    // Whether sample() would return the greedy choice (the first highest logit) for this
    // history: greedy with no logit_bias and no penalty that applies.
    bool plain_greedy(const std::vector<int32_t>& history) const;
    const SamplingParams& params() const { return params_; }

private:
    // Whether a penalty changes any logit (it applies to the last penalty_last_n tokens of history).
    bool penalizes() const;
    // The mirostat draw over cand_ (penalties and bias applied), which updates mu_.
    int32_t sample_mirostat(float max_logit, float inv_t);

    float mu_ = 0.0f;   // mirostat's running surprise bound, starting at 2 * tau

    SamplingParams params_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> cand_;   // scratch: (logit, id)
};

}  // namespace ember
