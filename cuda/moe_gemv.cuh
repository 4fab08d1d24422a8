// Shared by the mixture's expert GEMVs (moe_up.cu, moe_down.cu): an expert's rows as the decode
// GEMV's formats read them (gemv_formats.cuh, each type through its BlockDecoder), with the expert
// id taken from device memory, and the dispatch of a type to its format.
#pragma once
#include <type_traits>

#include "gated_act.cuh"
#include "gemv_formats.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

constexpr int kMoeRows = 4;   // warps a CTA, one output row each

// The units a lane strides over in one of the experts' rows (as gemv.cu's row_units).
inline int32_t expert_units(const MoeExperts& w) {
    switch (w.type) {
        case GGMLType::Q4_K:
        case GGMLType::Q5_K:
        case GGMLType::Q6_K: return int32_t(w.layout.n_blocks * 4);
        case GGMLType::IQ4_XS:
        case GGMLType::IQ3_S:
        case GGMLType::IQ3_XXS:
        case GGMLType::IQ2_XXS: return int32_t(w.layout.n_blocks * 8);
        case GGMLType::F32: return int32_t(w.n_in / 4);
        case GGMLType::F16:
        case GGMLType::BF16: return int32_t(w.n_in / 8);
        default: return int32_t(w.layout.n_blocks);
    }
}

// GemvParams for expert e of w reading x rows from xrow on.
__device__ __forceinline__ GemvParams expert_params(const MoeExperts& w, int32_t units, int e, const float* x,
                                                    const int8_t* xq, const float2* xds, int64_t xrow) {
    GemvParams p;
    p.w = w.base + size_t(e) * w.stride;
    p.meta = p.w + w.layout.meta_off;
    p.meta2 = p.w + w.layout.meta2_off;
    p.n_in = w.n_in;
    p.n_out = w.n_out;
    p.n_blocks = w.layout.n_blocks;
    p.units = units;
    p.x = x ? x + xrow * w.n_in : nullptr;
    p.xq = xq ? xq + xrow * w.n_in : nullptr;
    p.xds = xds ? xds + xrow * (w.n_in / 32) : nullptr;
    p.y = nullptr;
    return p;
}

// acc[r] += row `row` of p[r] . x over the warp's lanes (not yet summed over them); kDepth units a
// lane in flight for every weight (1 where a row is at most a unit a lane: fewer registers, more
// resident warps).
template <class F, int NT, int R, int kDepth>
__device__ __forceinline__ void warp_rows_dot(const GemvParams (&p)[R], int64_t row, float (&acc)[R][NT]) {
    const int lane = threadIdx.x & (kWarp - 1), units = p[0].units;
    for (int u0 = lane; u0 < units; u0 += kDepth * kWarp) {
        typename F::Data v[R][kDepth];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int k = 0; k < kDepth; ++k)
                if (u0 + k * kWarp < units) v[r][k] = F::load(p[r], row, u0 + k * kWarp);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int k = 0; k < kDepth; ++k)
                if (u0 + k * kWarp < units) F::template dot<NT>(p[r], u0 + k * kWarp, v[r][k], acc[r]);
    }
}

// Calls f(F{}) with the GEMV format of a type (gemv_formats.cuh); the 32-element formats in the
// lane-strided order (expert rows need not keep the CPU's order).
template <class Fn>
void with_format(GGMLType type, const char* op, Fn&& f) {
    switch (type) {
        case GGMLType::Q4_0: return f(FmtBlock32<DecodeQ4_0>{});
        case GGMLType::Q4_1: return f(FmtBlock32<DecodeQ4_1>{});
        case GGMLType::Q5_0: return f(FmtBlock32<DecodeQ5_0>{});
        case GGMLType::Q5_1: return f(FmtBlock32<DecodeQ5_1>{});
        case GGMLType::Q8_0: return f(FmtBlock32<DecodeQ8_0>{});
        case GGMLType::MXFP4: return f(FmtBlock32<DecodeMXFP4>{});
        case GGMLType::IQ4_NL: return f(FmtBlock32<DecodeIQ4_NL>{});
        case GGMLType::IQ4_XS: return f(FmtIQ4_XS{});
        case GGMLType::IQ3_S: return f(FmtIQ3_S{});
        case GGMLType::IQ3_XXS: return f(FmtIQ3_XXS{});
        case GGMLType::IQ2_XXS: return f(FmtIQ2_XXS{});
        case GGMLType::Q4_K: return f(FmtQK<false>{});
        case GGMLType::Q5_K: return f(FmtQK<true>{});
        case GGMLType::Q6_K: return f(FmtQ6_K{});
        case GGMLType::F32: return f(FmtFloat<float>{});
        case GGMLType::F16: return f(FmtFloat<__half>{});
        case GGMLType::BF16: return f(FmtFloat<__nv_bfloat16>{});
        default: fail("cuda ", op, ": unsupported expert type ", block_info(type).name);
    }
}

template <class Fn>
void with_chunk_tok(int32_t chunk_tok, const char* op, Fn&& f) {
    if (chunk_tok == 1) return f(std::integral_constant<int, 1>{});
    if (chunk_tok == kMaxGemvTokens) return f(std::integral_constant<int, kMaxGemvTokens>{});
    fail("cuda ", op, ": chunks of ", chunk_tok, " tokens (1 or ", kMaxGemvTokens, ")");
}

inline dim3 chunk_grid(int64_t n_rows, int32_t n_chunks, const char* op) {
    if (n_chunks < 1 || n_chunks > 65535) fail("cuda ", op, ": ", n_chunks, " chunks (1..65535)");
    return dim3(unsigned((n_rows + kMoeRows - 1) / kMoeRows), unsigned(n_chunks));
}

}  // namespace cuda
}  // namespace ember
