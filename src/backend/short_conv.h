// The check every backend makes of Backend::short_conv (the causal depthwise convolutions of gated
// DeltaNet, Mamba2 and LFM2 layers), and the size of its per-sequence state.
#pragma once
#include <cstdint>

#include "ember/status.h"

namespace ember {

// Floats of one sequence's convolution state: the last kernel - 1 inputs of every channel.
constexpr int64_t short_conv_state_floats(int32_t channels, int32_t kernel) { return (int64_t)(kernel - 1) * channels; }

inline void check_short_conv(int32_t n_tok, int32_t channels, int32_t kernel, const char* who) {
    if (n_tok < 0) fail(who, ": n_tok must be >= 0, got ", n_tok);
    if (channels <= 0) fail(who, ": channels must be positive, got ", channels);
    if (kernel <= 0) fail(who, ": kernel must be positive, got ", kernel);
}

}  // namespace ember
