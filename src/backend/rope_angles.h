// The rotation rope applies to pair i of a head at position pos, for every scaling a GGUF can ask
// for: plain (base^(-2i/d)), per-pair frequency factors (llama 3's rope_freqs), linear
// (freq_scale) and YaRN (ggml's ramp between interpolated and extrapolated angles, with its
// magnitude correction), LongRoPE (per-pair factors with an attention factor scaling cos and sin),
// and partial rotary (only a head's first n_rot dimensions rotate). Float math through the C library's powf, cosf and sinf: the CPU backend
// rotates with these values and the CUDA backend uploads tables of them, so both round alike.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace ember {

struct RopeParams {
    float base = 10000.0f;
    int32_t head_dim = 0; // a head's dimensions
    bool neox = false; // rotate (i, i + d/2) instead of adjacent pairs (2i, 2i + 1)
    float freq_scale = 1.0f; // linear / YaRN: 1 / scaling factor
    // YaRN: ext_factor 0 turns it off; corr_lo/corr_hi are ggml's correction dims (pairs below
    // lo keep the extrapolated angle, above hi the interpolated one); attn_factor scales cos/sin.
    float ext_factor = 0.0f, attn_factor = 1.0f, corr_lo = 0.0f, corr_hi = 0.0f;
    // [rotated() / 2] divisors of each pair's frequency (llama 3, LongRoPE), empty when none. Host memory.
    std::vector<float> freq_factors;
    // Partial rotary (Phi-3, GLM-4, ...): the first n_rot dimensions of each head rotate as a head of
    // n_rot would (its pairs, its frequencies base^(-2i/n_rot)), the rest pass through; 0: all of them.
    int32_t n_rot = 0;

    // Attention temperature (llama 4, Mistral 3): queries at position p are scaled by
    // 1 + temp_scale * ln(1 + floor((p + temp_offset) / temp_length)) (Backend::attn_temperature; keys
    // are not). 0: none. llama 4 counts positions from 1 (temp_offset 1), Mistral 3 from 0.
    float temp_scale = 0.0f;
    int32_t temp_length = 0;
    int32_t temp_offset = 0;

    int32_t rotated() const { return n_rot > 0 ? n_rot : head_dim; }

    bool operator==(const RopeParams& o) const {
        return base == o.base && head_dim == o.head_dim && neox == o.neox && freq_scale == o.freq_scale &&
               ext_factor == o.ext_factor && attn_factor == o.attn_factor && corr_lo == o.corr_lo &&
               corr_hi == o.corr_hi && freq_factors == o.freq_factors && rotated() == o.rotated() &&
               temp_scale == o.temp_scale && temp_length == o.temp_length && temp_offset == o.temp_offset;
    }
    bool operator!=(const RopeParams& o) const { return !(*this == o); }
};

// ggml's YaRN correction dims for a model trained on n_ctx_orig positions (head_dim: the rotated
// dimensions).
inline void rope_yarn_corr_dims(int32_t head_dim, int32_t n_ctx_orig, float base, float beta_fast, float beta_slow,
                                float& lo, float& hi) {
    const float pi = 3.14159265358979323846f;
    auto dim = [&](float n_rot) { return head_dim * std::log(n_ctx_orig / (n_rot * 2 * pi)) / (2 * std::log(base)); };
    lo = std::max(0.0f, std::floor(dim(beta_fast)));
    hi = std::min((float)(head_dim - 1), std::ceil(dim(beta_slow)));
}

inline void rope_cos_sin(int32_t pos, int32_t i, const RopeParams& r, float& c, float& s) {
    float theta = (float)pos * std::pow(r.base, -2.0f * i / r.rotated());
    if (!r.freq_factors.empty()) theta /= r.freq_factors[i];
    float mscale = r.attn_factor;
    float angle = r.freq_scale * theta;
    if (r.ext_factor != 0.0f) {
        const float y = (i - r.corr_lo) / std::max(0.001f, r.corr_hi - r.corr_lo);
        const float ramp = (1.0f - std::min(1.0f, std::max(0.0f, y))) * r.ext_factor;
        angle = angle * (1.0f - ramp) + theta * ramp;
        mscale *= 1.0f + 0.1f * std::log(1.0f / r.freq_scale);
    }
    c = std::cos(angle) * mscale;
    s = std::sin(angle) * mscale;
}

// The attention temperature's query scale at position pos (1 without one), in double as llama.cpp
// computes it, so every backend rounds it alike.
inline float rope_temperature(int32_t pos, const RopeParams& r) {
    if (r.temp_scale == 0.0f || r.temp_length <= 0) return 1.0f;
    return (float)(std::log(std::floor((double)(pos + r.temp_offset) / r.temp_length) + 1.0) * r.temp_scale + 1.0);
}

} // namespace ember
