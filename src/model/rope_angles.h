// The rotation rope applies to pair i of a head at position pos: cos and sin of
// pos * base^(-2i / head_dim), in float through the C library's powf, cosf and sinf. The CPU
// backend rotates with these values and the CUDA backend uploads tables of them, so both round
// alike (CUDA's own sin and cos differ from glibc's in a few percent of these angles).
#pragma once
#include <cmath>
#include <cstdint>

namespace ember {

inline void rope_cos_sin(int32_t pos, int32_t i, int32_t head_dim, float base, float& c, float& s) {
    const float theta = (float)pos * std::pow(base, -2.0f * i / head_dim);
    c = std::cos(theta);
    s = std::sin(theta);
}

}  // namespace ember
