// SamplingParams from the keyword arguments the Sampler and Engine.add_request bindings share.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "ember/sampling.h"

inline ember::SamplingParams sampling_params_arg(float temperature, int32_t top_k, float top_p, float min_p,
                                                 float repeat_penalty, float frequency_penalty, float presence_penalty,
                                                 int32_t penalty_last_n,
                                                 std::vector<std::pair<int32_t, float>> logit_bias, uint64_t seed) {
    ember::SamplingParams p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repeat_penalty = repeat_penalty;
    p.frequency_penalty = frequency_penalty;
    p.presence_penalty = presence_penalty;
    p.penalty_last_n = penalty_last_n;
    p.logit_bias = std::move(logit_bias);
    p.seed = seed;
    return p;
}
