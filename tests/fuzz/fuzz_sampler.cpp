// libFuzzer target: the sampler on arbitrary parameters (NaN, inf, negative and huge values
// included), logits, history and logit_bias. Sampler must either throw InvalidInput or return
// an id in [0, n_vocab) that is drawable: its logit is not NaN and its bias is not -inf.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "ember/sampling.h"
#include "ember/status.h"

namespace {

// A float that is often one of the edge values, else any bit pattern.
float any_float(FuzzedDataProvider& in) {
    static const float edges[] = {
        0.0f,
        -0.0f,
        1.0f,
        -1.0f,
        0.5f,
        2.0f,
        1e-30f,
        -1e-30f,
        1e30f,
        -1e30f,
        std::numeric_limits<float>::max(),
        -std::numeric_limits<float>::max(),
        std::numeric_limits<float>::denorm_min(),
        std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN(),
    };
    const uint8_t pick = in.ConsumeIntegral<uint8_t>();
    if (pick < 2 * sizeof(edges) / sizeof(edges[0])) return edges[pick / 2];
    return in.ConsumeFloatingPoint<float>();
}

int32_t any_int(FuzzedDataProvider& in, int32_t small_max) {
    return in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(-2, small_max) : in.ConsumeIntegral<int32_t>();
}

[[noreturn]] void violated(const char* what, int32_t id) {
    std::fprintf(stderr, "fuzz_sampler: %s (id %d)\n", what, id);
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    ember::SamplingParams p;
    p.temperature = any_float(in);
    p.top_k = any_int(in, 300);
    p.top_p = any_float(in);
    p.min_p = any_float(in);
    p.repeat_penalty = any_float(in);
    p.frequency_penalty = any_float(in);
    p.presence_penalty = any_float(in);
    p.penalty_last_n = any_int(in, 300);
    p.seed = in.ConsumeIntegral<uint64_t>();
    const int32_t n_vocab = in.ConsumeIntegralInRange<int32_t>(0, 300);
    const size_t n_bias = in.ConsumeIntegralInRange<size_t>(0, 8);
    for (size_t i = 0; i < n_bias; ++i) p.logit_bias.emplace_back(any_int(in, n_vocab + 1), any_float(in));
    std::vector<int32_t> history(in.ConsumeIntegralInRange<size_t>(0, 64));
    for (int32_t& id : history) id = any_int(in, n_vocab + 1);
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    for (float& l : logits) l = in.remaining_bytes() ? any_float(in) : 0.0f;

    try {
        ember::Sampler sampler(p);
        for (int draw = 0; draw < 3; ++draw) {
            const int32_t id = sampler.sample(logits.data(), n_vocab, history);
            if (id < 0 || id >= n_vocab) violated("sampled id outside [0, n_vocab)", id);
            if (std::isnan(logits[id])) violated("sampled a token whose logit is NaN", id);
            for (const auto& [bid, bias] : p.logit_bias)
                if (bid == id && bias == -std::numeric_limits<float>::infinity())
                    violated("sampled a token whose logit_bias is -inf", id);
            history.push_back(id);
        }
    } catch (const ember::InvalidInput&) {}
    return 0;
}
