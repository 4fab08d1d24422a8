// Re-layout of raw ggml blocks into the packed upload layout (weight_pack.h) on the GPU, so that
// streamed weights cost the host only a copy: a CTA stages 128 consecutive blocks in shared
// memory with coalesced 4-byte loads, then each thread writes one block's quants and metadata
// with aligned vector stores.
#include <type_traits>

#include "cuda_check.h"
#include "weight_pack.h"
#include "weight_stream.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kPerCta = 128;

// N bytes from s (shared memory, any alignment) to d (aligned to the store width).
template <int N>
__device__ __forceinline__ void put(uint8_t* d, const uint8_t* s) {
    using V = std::conditional_t<N % 16 == 0, uint4,
                                 std::conditional_t<N == 8, uint2, std::conditional_t<N == 4, uint32_t, uint16_t>>>;
    static_assert(N % sizeof(V) == 0, "unsupported width");
#pragma unroll
    for (int i = 0; i < N; i += int(sizeof(V))) {
        V v;
        uint8_t* b = reinterpret_cast<uint8_t*>(&v);
#pragma unroll
        for (int j = 0; j < int(sizeof(V)); ++j) b[j] = s[i + j];
        *reinterpret_cast<V*>(d + i) = v;
    }
}

// BB: bytes per ggml block; QS / META: bytes per block in the quants / metadata regions.
template <GGMLType T, int BB, int QS, int META>
__global__ void pack_kernel(const uint8_t* __restrict__ raw, uint8_t* __restrict__ qs, uint8_t* __restrict__ meta,
                            uint8_t* __restrict__ meta2, int64_t nblk) {
    __shared__ uint32_t words[(kPerCta * BB + 3) / 4];
    uint8_t* sm = reinterpret_cast<uint8_t*>(words);
    const int64_t b0 = int64_t(blockIdx.x) * kPerCta;
    const int nb = int(min(int64_t(kPerCta), nblk - b0));
    const int bytes = nb * BB;
    const uint8_t* src = raw + b0 * BB;   // 4-byte aligned: kPerCta * BB is a multiple of 4
    const uint32_t* src4 = reinterpret_cast<const uint32_t*>(src);
    for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x) words[i] = src4[i];
    for (int i = bytes / 4 * 4 + threadIdx.x; i < bytes; i += blockDim.x) sm[i] = src[i];
    __syncthreads();
    if (int(threadIdx.x) >= nb) return;
    const uint8_t* s = sm + threadIdx.x * BB;
    const int64_t b = b0 + threadIdx.x;
    if constexpr (T == GGMLType::Q6_K) {   // {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
        put<192>(qs + b * 192, s);
        put<16>(meta + b * 16, s + 192);
        put<2>(meta2 + b * 2, s + 208);
    } else if constexpr (T == GGMLType::MXFP4) {   // {u8 e; u8 qs[16]} -> meta {e, 0}
        const uint8_t m[2] = {s[0], 0};
        put<2>(meta + b * 2, m);
        put<16>(qs + b * 16, s + 1);
    } else if constexpr (T ==
                         GGMLType::IQ3_S) {   // {f16 d; qs[64], qh[8], signs[32], scales[4]} -> qs, signs, qh, scales
        uint8_t q[112] = {};
        for (int k = 0; k < 64; ++k) q[k] = s[2 + k];
        for (int k = 0; k < 32; ++k) q[64 + k] = s[74 + k];
        for (int k = 0; k < 8; ++k) q[96 + k] = s[66 + k];
        for (int k = 0; k < 4; ++k) q[104 + k] = s[106 + k];
        put<112>(qs + b * 112, q);
        put<2>(meta + b * 2, s);
    } else if constexpr (T == GGMLType::IQ2_XS) {   // {f16 d; u16 qs[32]; u8 scales[8]} -> qs, scales, 8 of pad
        uint8_t q[80] = {};
        for (int k = 0; k < 72; ++k) q[k] = s[2 + k];
        put<80>(qs + b * 80, q);
        put<2>(meta + b * 2, s);
    } else if constexpr (T == GGMLType::TQ1_0 || T == GGMLType::TQ2_0 || T == GGMLType::IQ1_M || T == GGMLType::Q2_K ||
                         T == GGMLType::Q3_K) {
        // {quants; metadata}: TQ1_0 {qs, qh; d}, TQ2_0 {qs; d}, IQ1_M {qs, qh, scales} (no meta),
        // Q2_K {scales, qs; d, dmin}, Q3_K {hmask, qs, scales; d}
        uint8_t q[QS] = {};
        for (int k = 0; k < BB - META; ++k) q[k] = s[k];
        put<QS>(qs + b * QS, q);
        if constexpr (META > 0) put<META>(meta + b * META, s + BB - META);
    } else if constexpr (T == GGMLType::Q5_0) {   // {f16 d; u8 qh[4]; u8 qs[16]} -> MetaQ5_0 {d, 0, qh}
        const uint8_t m[8] = {s[0], s[1], 0, 0, s[2], s[3], s[4], s[5]};
        put<8>(meta + b * 8, m);
        put<16>(qs + b * 16, s + 6);
    } else {   // {metadata; quants}: Q4_0 {d}, Q4_1 {d, m}, Q5_1 {d, m, qh}, Q8_0 {d}, IQ4_NL {d},
               // IQ4_XS {d, scales_h, scales_l}, IQ3_XXS, IQ2_XXS, IQ2_S and IQ1_S {d}, NVFP4 {d[4]}
        put<META>(meta + b * META, s);
        put<QS>(qs + b * QS, s + META);
    }
}

}  // namespace

void pack_weight_device(GGMLType type, int64_t n_in, int64_t n_out, const uint8_t* raw, uint8_t* dst, cudaStream_t st) {
    const PackedLayout L = packed_layout(type, n_in, n_out);
    const int64_t nblk = L.n_blocks * n_out;
    if (nblk == 0) return;
    uint8_t* qs = dst;
    uint8_t* meta = dst + L.meta_off;
    uint8_t* meta2 = dst + L.meta2_off;
    const unsigned grid = unsigned((nblk + kPerCta - 1) / kPerCta);
    switch (type) {
        case GGMLType::Q4_0:
            pack_kernel<GGMLType::Q4_0, 18, 16, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::Q4_1:
            pack_kernel<GGMLType::Q4_1, 20, 16, 4><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::Q5_0:
            pack_kernel<GGMLType::Q5_0, 22, 16, 8><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::Q5_1:
            pack_kernel<GGMLType::Q5_1, 24, 16, 8><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::Q8_0:
            pack_kernel<GGMLType::Q8_0, 34, 32, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::MXFP4:
            pack_kernel<GGMLType::MXFP4, 17, 16, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::IQ4_NL:
            pack_kernel<GGMLType::IQ4_NL, 18, 16, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::IQ4_XS:
            pack_kernel<GGMLType::IQ4_XS, 136, 128, 8><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::IQ3_S:
            pack_kernel<GGMLType::IQ3_S, 110, 112, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::IQ3_XXS:
            pack_kernel<GGMLType::IQ3_XXS, 98, 96, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::IQ2_XXS:
            pack_kernel<GGMLType::IQ2_XXS, 66, 64, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::IQ2_XS:
            pack_kernel<GGMLType::IQ2_XS, 74, 80, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::IQ2_S:
            pack_kernel<GGMLType::IQ2_S, 82, 80, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::IQ1_S:
            pack_kernel<GGMLType::IQ1_S, 50, 48, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::IQ1_M:
            pack_kernel<GGMLType::IQ1_M, 56, 64, 0><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::TQ1_0:
            pack_kernel<GGMLType::TQ1_0, 54, 64, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::Q2_K:
            pack_kernel<GGMLType::Q2_K, 84, 80, 4><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::Q3_K:
            pack_kernel<GGMLType::Q3_K, 110, 112, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::TQ2_0:
            pack_kernel<GGMLType::TQ2_0, 66, 64, 2><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::NVFP4:
            pack_kernel<GGMLType::NVFP4, 36, 32, 4><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        case GGMLType::Q6_K:
            pack_kernel<GGMLType::Q6_K, 210, 192, 16><<<grid, kPerCta, 0, st>>>(raw, qs, meta, meta2, nblk);
            break;
        default: fail("cuda: no device re-layout for weight type ", block_info(type).name);
    }
    EMBER_CUDA_LAUNCHED("pack_weight_device");
}

}  // namespace cuda
}  // namespace ember
