// The gated activations of a feed-forward, act(gate) * up, as the CPU computes them; shared by the
// element-wise kernels and the mixture's expert GEMVs, which apply them as they write their rows.
#pragma once
#include "backend/backend.h"
#include "common.cuh"

namespace ember {
namespace cuda {

// SwiGLUClamped's clamp and sigmoid slope (gpt-oss's; the CPU's kSwiGLULimit, kSwiGLUAlpha).
constexpr float kSwiGLULimit = 7.0f, kSwiGLUAlpha = 1.702f;

// act(gate) * up with glibc's expf algorithm. GeLU's tanh form 0.5 x (1 + tanh(y)) is
// x / (1 + exp(-2y)) with y = sqrt(2 / pi) (x + 0.044715 x^3): the same exp, and the products
// rounded one by one (no contraction), so the bits are the CPU's.
template <Activation A>
__device__ __forceinline__ float gated(float g, float u) {
    if constexpr (A == Activation::SiLU) {
        return g / (1.f + expf_glibc(-g)) * u;
    } else if constexpr (A == Activation::SwiGLUClamped) {
        const float gc = fminf(g, kSwiGLULimit);
        const float uc = __fadd_rn(fmaxf(fminf(u, kSwiGLULimit), -kSwiGLULimit), 1.f);
        return gc / (1.f + expf_glibc(__fmul_rn(-kSwiGLUAlpha, gc))) * uc;
    } else {
        const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
        return g / (1.f + expf_glibc(__fmul_rn(-1.5957691216057308f, __fadd_rn(g, cube)))) * u;
    }
}

// Calls f(std::integral_constant<Activation, A>) for the runtime activation.
template <class Fn>
void with_activation(Activation act, Fn&& f) {
    switch (act) {
        case Activation::SiLU: return f(std::integral_constant<Activation, Activation::SiLU>{});
        case Activation::GeLUTanh: return f(std::integral_constant<Activation, Activation::GeLUTanh>{});
        case Activation::SwiGLUClamped: return f(std::integral_constant<Activation, Activation::SwiGLUClamped>{});
    }
    fail("cuda: unknown activation ", int(act));
}

}  // namespace cuda
}  // namespace ember
