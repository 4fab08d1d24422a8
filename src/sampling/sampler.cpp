// The token sampler (include/ember/sampling.h): parameter checks and the sampling chain
// logit_bias -> penalties -> (greedy | top_k -> typical -> top_p -> min_p -> temperature -> softmax
// -> draw | temperature -> mirostat v1 or v2).
#include "ember/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/greedy_token.h"
#include "ember/status.h"

namespace ember {

namespace {

constexpr uint64_t kRandomSeed = 0xFFFFFFFFu;

// Orders candidates by logit, highest first; ties by lower id so results never depend on the
// sort algorithm.
bool higher(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Uniform double in [0, 1) from the top 53 bits: the same on every standard library, unlike
// std::uniform_real_distribution, so a seed gives the same tokens everywhere.
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); }

void validate(const SamplingParams& p) {
    if (!std::isfinite(p.temperature))
        fail("sampling: temperature must be a finite number (<= 0 means greedy), got ", p.temperature);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("sampling: top_p must be in (0, 1], got ", p.top_p);
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("sampling: min_p must be in [0, 1], got ", p.min_p);
    if (!(p.repeat_penalty > 0.0f) || !std::isfinite(p.repeat_penalty))
        fail("sampling: repeat_penalty must be a finite number > 0, got ", p.repeat_penalty);
    if (!std::isfinite(p.frequency_penalty))
        fail("sampling: frequency_penalty must be finite, got ", p.frequency_penalty);
    if (!std::isfinite(p.presence_penalty)) fail("sampling: presence_penalty must be finite, got ", p.presence_penalty);
    if (!(p.typical_p > 0.0f)) fail("sampling: typical_p must be > 0 (>= 1: off), got ", p.typical_p);
    if (p.mirostat < 0 || p.mirostat > 2) fail("sampling: mirostat must be 0 (off), 1 or 2, got ", p.mirostat);
    if (!(p.mirostat_tau > 0.0f) || !std::isfinite(p.mirostat_tau))
        fail("sampling: mirostat_tau must be a finite number > 0, got ", p.mirostat_tau);
    if (!(p.mirostat_eta > 0.0f) || !std::isfinite(p.mirostat_eta))
        fail("sampling: mirostat_eta must be a finite number > 0, got ", p.mirostat_eta);
    if (p.penalty_last_n < -1)
        fail("sampling: penalty_last_n must be >= -1 (-1 = whole history), got ", p.penalty_last_n);
    for (const auto& [id, bias] : p.logit_bias) {
        if (id < 0) fail("sampling: logit_bias token id must be >= 0, got ", id);
        if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity())
            fail("sampling: logit_bias for token ", id, " must be finite or -inf, got ", bias);
    }
}

// exp(x) in float: a float exp is several times cheaper than a double one, and the weights are
// summed in double, so the distribution keeps full float precision.
inline double weight(float logit, float max_logit, float inv_t) {
    return static_cast<double>(std::exp((logit - max_logit) * inv_t));
}

// top_p over unsorted candidates (no top_k), where sorting the whole vocabulary is too slow.
// One pass buckets the logits on a linear scale and sums each bucket's probability mass (at
// temperature 1); walking the buckets from the top finds the one where the mass reaches
// top_p * total; only candidates at or above it (and not below `floor`, which min_p drops
// anyway) are moved to the front and sorted, and the nucleus is a prefix of them.
// Returns the nucleus size.
size_t top_p_unsorted(std::vector<std::pair<float, int32_t>>& cand, size_t n, float max_logit, float top_p,
                      float floor) {
    constexpr int kBuckets = 256;
    float min_logit = max_logit;
    for (size_t i = 0; i < n; ++i)
        if (std::isfinite(cand[i].first)) min_logit = std::min(min_logit, cand[i].first);
    // In double: the span of two finite floats can overflow a float (and inf * 0 is NaN).
    const double span = static_cast<double>(max_logit) - min_logit;
    const double scale = span > 0.0 ? (kBuckets - 1) / span : 0.0;
    auto bucket_of = [&](float l) {
        return l >= min_logit ? static_cast<int>((static_cast<double>(l) - min_logit) * scale)
                              : -1;   // -1: -inf, no mass
    };
    double mass[kBuckets] = {};
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const int b = bucket_of(cand[i].first);
        if (b < 0) continue;
        const double w = weight(cand[i].first, max_logit, 1.0f);
        mass[b] += w;
        total += w;
    }
    const double target = static_cast<double>(top_p) * total;
    int cut = kBuckets - 1;
    for (double cum = 0.0; cut > 0; --cut) {
        cum += mass[cut];
        if (cum >= target) break;
    }
    const float lowest = std::max(floor, min_logit);
    auto head_end = std::partition(cand.begin(), cand.begin() + n, [&](const std::pair<float, int32_t>& c) {
        return c.first >= lowest && bucket_of(c.first) >= cut;
    });
    std::sort(cand.begin(), head_end, higher);
    const size_t head = static_cast<size_t>(head_end - cand.begin());
    double cum = 0.0;
    for (size_t i = 0; i < head; ++i) {
        cum += weight(cand[i].first, max_logit, 1.0f);
        if (cum >= target) return i + 1;
    }
    return std::max<size_t>(head, 1);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params) {
    validate(params_);
    mu_ = 2.0f * params_.mirostat_tau;
    if (params_.seed == kRandomSeed) {
        std::random_device rd;
        rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
    } else {
        rng_.seed(params_.seed);
    }
}

bool Sampler::penalizes() const {
    const SamplingParams& p = params_;
    return p.penalty_last_n != 0 &&
           (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
}

bool Sampler::plain_greedy(const std::vector<int32_t>& history) const {
    const SamplingParams& p = params_;
    return (p.temperature <= 0.0f || !std::isfinite(1.0f / p.temperature)) && p.logit_bias.empty() &&
           !(penalizes() && !history.empty());
}

int32_t Sampler::sample(const float* logits, int32_t n_vocab, const std::vector<int32_t>& history) {
    const SamplingParams& p = params_;
    if (logits == nullptr || n_vocab <= 0) fail("sampling: logits must hold n_vocab > 0 floats, got ", n_vocab);

    // Penalties count each distinct token of the window (the last penalty_last_n of history).
    const bool penalize = penalizes();

    // Greedy with nothing to adjust (the engine's usual decode): read in place.
    if (plain_greedy(history)) {
        const int32_t best = greedy_token(logits, n_vocab);
        if (best < 0) fail("sampling: no token can be drawn: every logit is -inf or NaN after logit_bias/penalties");
        return best;
    }

    // cand_[i] = (logit, id); while unsorted, cand_[id] is token id's entry.
    cand_.resize(static_cast<size_t>(n_vocab));
    // NaN would break the sort's ordering; it can never be drawn, so it becomes -inf.
    for (int32_t i = 0; i < n_vocab; ++i)
        cand_[i] = {std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i], i};

    constexpr float kInf = std::numeric_limits<float>::infinity();
    for (const auto& [id, bias] : p.logit_bias) {
        if (id >= n_vocab) fail("sampling: logit_bias token id ", id, " is out of range (n_vocab ", n_vocab, ")");
        // -inf bans the token whatever its logit (+inf + -inf would be NaN).
        cand_[id].first = bias == -kInf ? -kInf : cand_[id].first + bias;
    }

    if (penalize && !history.empty()) {
        size_t n = history.size();
        if (p.penalty_last_n > 0) n = std::min(n, static_cast<size_t>(p.penalty_last_n));
        std::vector<int32_t> window(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
        std::sort(window.begin(), window.end());
        for (size_t i = 0; i < window.size();) {
            const int32_t id = window[i];
            size_t j = i;
            while (j < window.size() && window[j] == id) ++j;
            if (id < 0 || id >= n_vocab)
                fail("sampling: history token id ", id, " is out of range (n_vocab ", n_vocab, ")");
            const float count = static_cast<float>(j - i);
            float& l = cand_[id].first;
            l = l <= 0.0f ? l * p.repeat_penalty : l / p.repeat_penalty;
            l -= count * p.frequency_penalty + p.presence_penalty;
            // An infinite logit minus a penalty that overflowed to the same infinity: never drawn.
            if (std::isnan(l)) l = -kInf;
            i = j;
        }
    }

    auto best = std::min_element(cand_.begin(), cand_.end(), higher);
    const float max_logit = best->first;
    if (!(max_logit > -kInf))
        fail("sampling: no token can be drawn: every logit is -inf or NaN after logit_bias/penalties");
    // A +inf logit is a certainty (and would make every weight below NaN); so is a temperature
    // too small for 1/temperature to be finite.
    const float inv_t = 1.0f / p.temperature;
    if (p.temperature <= 0.0f || max_logit == kInf || !std::isfinite(inv_t)) return best->second;
    if (p.mirostat != 0) return sample_mirostat(max_logit, inv_t);

    // Truncation. `sorted` tracks whether cand_[0..n) is in descending order.
    size_t n = cand_.size();
    bool sorted = false;
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
        n = static_cast<size_t>(p.top_k);
        std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), higher);
        sorted = true;
    }

    if (p.typical_p < 1.0f) {
        // Locally typical: keep the tokens whose surprise is closest to the entropy, up to
        // typical_p of the mass (probabilities at temperature 1), then back in logit order.
        if (!sorted) {
            std::sort(cand_.begin(), cand_.begin() + n, higher);
            sorted = true;
        }
        std::vector<double> prob(n);
        double total = 0.0;
        for (size_t i = 0; i < n; ++i) total += prob[i] = weight(cand_[i].first, max_logit, 1.0f);
        double entropy = 0.0;
        for (size_t i = 0; i < n; ++i) {
            prob[i] /= total;
            if (prob[i] > 0.0) entropy -= prob[i] * std::log(prob[i]);
        }
        std::vector<size_t> order(n);
        for (size_t i = 0; i < n; ++i) order[i] = i;
        auto distance = [&](size_t i) {
            return prob[i] > 0.0 ? std::abs(-std::log(prob[i]) - entropy) : std::numeric_limits<double>::infinity();
        };
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return distance(a) < distance(b); });
        size_t kept = 0;
        double cum = 0.0;
        while (kept < n) {
            cum += prob[order[kept++]];
            if (cum >= p.typical_p) break;
        }
        std::vector<std::pair<float, int32_t>> typical(kept);
        for (size_t i = 0; i < kept; ++i) typical[i] = cand_[order[i]];
        std::sort(typical.begin(), typical.end(), higher);
        std::copy(typical.begin(), typical.end(), cand_.begin());
        n = kept;
    }

    // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p); the best token always stays.
    const float min_p_floor = p.min_p > 0.0f ? max_logit + std::log(p.min_p) : -kInf;
    if (p.top_p < 1.0f) {
        // Smallest prefix (by probability at temperature 1) whose mass reaches top_p.
        if (sorted) {
            double total = 0.0;
            for (size_t i = 0; i < n; ++i) total += weight(cand_[i].first, max_logit, 1.0f);
            const double target = static_cast<double>(p.top_p) * total;
            double cum = 0.0;
            for (size_t i = 0; i < n; ++i) {
                cum += weight(cand_[i].first, max_logit, 1.0f);
                if (cum >= target) {
                    n = i + 1;
                    break;
                }
            }
        } else {
            n = top_p_unsorted(cand_, n, max_logit, p.top_p, min_p_floor);
        }
    }

    if (p.min_p > 0.0f) {
        size_t kept = 0;
        for (size_t i = 0; i < n; ++i)
            if (cand_[i].first >= min_p_floor) cand_[kept++] = cand_[i];
        n = kept;   // the order of survivors is preserved, so a sorted head stays sorted
    }

    // Temperature, softmax and the draw, over cand_[0..n).
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += weight(cand_[i].first, max_logit, inv_t);
    const double u = uniform01(rng_) * total;
    double cum = 0.0;
    size_t last = 0;
    for (size_t i = 0; i < n; ++i) {
        const double w = weight(cand_[i].first, max_logit, inv_t);
        if (w <= 0.0) continue;
        cum += w;
        last = i;
        if (u < cum) return cand_[i].second;
    }
    return cand_[last].second;   // u landed on the rounding slack at the very top
}

int32_t Sampler::sample_mirostat(float max_logit, float inv_t) {
    const SamplingParams& p = params_;
    std::sort(cand_.begin(), cand_.end(), higher);
    size_t n = cand_.size();
    std::vector<double> prob(n);
    auto normalize = [&](size_t count) {
        double total = 0.0;
        for (size_t i = 0; i < count; ++i) total += prob[i] = weight(cand_[i].first, max_logit, inv_t);
        for (size_t i = 0; i < count; ++i) prob[i] /= total;
    };
    normalize(n);
    if (p.mirostat == 1) {
        // Estimate the Zipf exponent s from the top m tokens, then keep the k tokens whose
        // expected surprise is mu (the paper's formula, as llama.cpp has it).
        constexpr size_t kM = 100;
        double sum_tb = 0.0, sum_tt = 0.0;
        for (size_t i = 0; i + 1 < std::min(kM, n); ++i) {
            if (!(prob[i] > 0.0 && prob[i + 1] > 0.0)) break;
            const double t = std::log((i + 2.0) / (i + 1.0));
            sum_tb += t * std::log(prob[i] / prob[i + 1]);
            sum_tt += t * t;
        }
        const double s_hat = sum_tt > 0.0 ? sum_tb / sum_tt : 1.0;
        const double eps = s_hat - 1.0;
        // (eps and 1 - n^-eps share their sign, so k > 0 either side of s_hat = 1.)
        double k = eps != 0.0 && s_hat > 0.0
                       ? std::pow(eps * std::pow(2.0, mu_) / (1.0 - std::pow(static_cast<double>(n), -eps)),
                                  1.0 / s_hat)
                       : static_cast<double>(n);
        if (!std::isfinite(k)) k = static_cast<double>(n);
        n = std::clamp<size_t>(static_cast<size_t>(k), 1, n);
    } else {
        // Drop the tokens more surprising than mu (the most likely always stays).
        size_t kept = 1;
        while (kept < n && -std::log2(prob[kept]) <= mu_) ++kept;
        n = kept;
    }
    normalize(n);
    const double u = uniform01(rng_);
    double cum = 0.0;
    size_t pick = n - 1;
    for (size_t i = 0; i < n; ++i) {
        cum += prob[i];
        if (u < cum) {
            pick = i;
            break;
        }
    }
    const double surprise = -std::log2(prob[pick]);
    mu_ -= p.mirostat_eta * static_cast<float>(surprise - p.mirostat_tau);
    return cand_[pick].second;
}

}  // namespace ember
