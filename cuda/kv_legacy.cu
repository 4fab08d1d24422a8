// q4_0, q4_1, q5_0, q5_1 and iq4_nl KV caches (layout: src/backend/kv_layout.h, rows of ggml's blocks
// of 32): storing new K/V rows with the CPU's scalar quantizers' arithmetic (so both backends store
// equal bytes), and expanding the blocks a batch reads into the f16 copy the attention kernels read.
#include <type_traits>

#include "common.cuh"
#include "kernels.h"
#include "quant/quant_tables.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

// Bytes of a block, and of its scale fields before the quants: d (f16), then m (f16) for the
// min-offset types, then qh (4 bytes) for the 5-bit ones, then 16 bytes of nibbles.
template <GGMLType T>
struct Legacy {
    static constexpr bool kMin = T == GGMLType::Q4_1 || T == GGMLType::Q5_1;
    static constexpr bool kFive = T == GGMLType::Q5_0 || T == GGMLType::Q5_1;
    static constexpr int kHeader = 2 + (kMin ? 2 : 0) + (kFive ? 4 : 0);
    static constexpr int kBytes = kHeader + 16;
    static constexpr int kMaxQ = kFive ? 31 : 15;
};

// IQ4_NL's 16 levels (quant_tables.h) in device memory.
struct Iq4nlLevels {
    int8_t v[16];
};
static __device__ const Iq4nlLevels kIq4nl = {
    {kvalues_iq4nl[0], kvalues_iq4nl[1], kvalues_iq4nl[2], kvalues_iq4nl[3], kvalues_iq4nl[4], kvalues_iq4nl[5],
     kvalues_iq4nl[6], kvalues_iq4nl[7], kvalues_iq4nl[8], kvalues_iq4nl[9], kvalues_iq4nl[10], kvalues_iq4nl[11],
     kvalues_iq4nl[12], kvalues_iq4nl[13], kvalues_iq4nl[14], kvalues_iq4nl[15]}};

// The level of IQ4_NL nearest x (a tie to the upper one), as the CPU's quantize_row_iq4_nl.
__device__ __forceinline__ int iq4nl_level(float x) {
    const int8_t* v = kIq4nl.v;
    if (x <= float(v[0])) return 0;
    if (x >= float(v[15])) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < float(v[mid])) hi = mid;
        else lo = mid;
    }
    return __fsub_rn(x, float(v[hi - 1])) < __fsub_rn(float(v[hi]), x) ? hi - 1 : hi;
}

// IQ4_NL of one 32-value group (lane j: element j, mx the first value of largest magnitude): the
// level of each value and the block's d, the least-squares fit summed in element order by lane 0 as the
// CPU sums it; returns the lane's level and writes d.
__device__ __forceinline__ int iq4nl_quantize(float x, float mx, float& d) {
    const bool live = fabsf(mx) >= 1e-15f;
    const float id = live ? __fdiv_rn(1.f, __fdiv_rn(mx, -127.f)) : 0.f;
    const int level = live ? iq4nl_level(__fmul_rn(id, x)) : 0;
    const float q = float(kIq4nl.v[level]), w = __fmul_rn(x, x);
    const float qx = __fmul_rn(__fmul_rn(w, q), x), q2 = __fmul_rn(__fmul_rn(w, q), q);
    float sumqx = 0.f, sumq2 = 0.f;
    for (int j = 0; j < 32; ++j) {
        sumqx = __fadd_rn(sumqx, __shfl_sync(0xffffffffu, qx, j));
        sumq2 = __fadd_rn(sumq2, __shfl_sync(0xffffffffu, q2, j));
    }
    d = live && sumq2 > 0.f ? __fdiv_rn(sumqx, sumq2) : 0.f;
    return level;
}

// The value of largest magnitude of a warp's 32 values, the first of equals (the CPU's signed_absmax).
__device__ __forceinline__ float signed_absmax(float x) {
    float a = fabsf(x);
    int at = threadIdx.x & 31;
    for (int o = 16; o > 0; o >>= 1) {
        const float ao = __shfl_xor_sync(0xffffffffu, a, o);
        const int ato = __shfl_xor_sync(0xffffffffu, at, o);
        if (ao > a || (ao == a && ato < at)) {
            a = ao;
            at = ato;
        }
    }
    return __shfl_sync(0xffffffffu, x, at);
}

// One warp per 32-value group of one token's K or V row (lane j: element j of the group).
// Products and sums rounded one at a time, as the CPU's scalar code (no fused multiply-add).
template <GGMLType T>
__global__ void kv_store_legacy_kernel(uint8_t* __restrict__ kc, uint8_t* __restrict__ vc, int32_t block_size,
                                       int32_t kv_dim, const float* __restrict__ k, const float* __restrict__ v,
                                       int32_t n_tok, DeviceBatch b) {
    using L = Legacy<T>;
    pdl_wait();
    pdl_trigger();
    const int groups = kv_dim / 32;
    const int64_t g = int64_t(blockIdx.x) * (blockDim.x / kWarp) + (threadIdx.x >> 5);
    if (g >= int64_t(n_tok) * 2 * groups) return;
    const int lane = threadIdx.x & 31;
    const int t = int(g / (2 * groups)), r = int(g % (2 * groups)), is_v = r >= groups, grp = r % groups;
    uint8_t* cache = is_v ? vc : kc;
    if (!cache) return;   // (warp-uniform)
    const int p = b.pos[t];
    const int64_t phys = b.block_table[int64_t(b.seq[t]) * b.max_blocks + p / block_size];
    uint8_t* blk = cache + ((phys * block_size + p % block_size) * groups + grp) * L::kBytes;
    const float x = (is_v ? v : k)[int64_t(t) * kv_dim + grp * 32 + lane];
    float d, base;   // q = trunc((x - base) * (1 / d) + offset)
    float offset;
    if constexpr (T == GGMLType::IQ4_NL) {
        d = base = offset = 0.f;
    } else if constexpr (L::kMin) {
        float mn = x, mx = x;
        for (int o = 16; o > 0; o >>= 1) {
            mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        }
        d = __fsub_rn(mx, mn) / float(L::kMaxQ);
        base = mn;
        offset = 0.5f;
        if (lane == 0) reinterpret_cast<__half*>(blk)[1] = __float2half_rn(mn);
    } else {
        d = signed_absmax(x) / (L::kFive ? -16.f : -8.f);
        base = 0.f;
        offset = L::kFive ? 16.5f : 8.5f;
    }
    int q;
    if constexpr (T == GGMLType::IQ4_NL) {
        q = iq4nl_quantize(x, signed_absmax(x), d);
    } else {
        const float id = d != 0.f ? 1.f / d : 0.f;
        const float y = __fadd_rn(__fmul_rn(L::kMin ? __fsub_rn(x, base) : x, id), offset);
        q = min(int(y), L::kMaxQ);
    }
    if (lane == 0) reinterpret_cast<__half*>(blk)[0] = __float2half_rn(d);
    // Nibbles: byte j holds element j (low) and element j + 16 (high).
    const int hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16) blk[L::kHeader + lane] = uint8_t((q & 0x0F) | ((hi & 0x0F) << 4));
    if constexpr (L::kFive) {
        const uint32_t h = __ballot_sync(0xffffffffu, (q >> 4) & 1);
        if (lane < 4) blk[2 + (L::kMin ? 2 : 0) + lane] = uint8_t(h >> (8 * lane));
    }
}

// grid.x: (sequence, block index < n_blk) of the batch's block tables; grid.y: runs of
// kExpandThreads values of that block; each thread one value of K and of V (either may be null).
constexpr int kExpandThreads = 256;

template <GGMLType T>
__device__ __forceinline__ float legacy_value(const uint8_t* blk, int j) {
    using L = Legacy<T>;
    const float d = __half2float(reinterpret_cast<const __half*>(blk)[0]);
    const uint8_t byte = blk[L::kHeader + (j & 15)];
    int q = j < 16 ? byte & 0x0F : byte >> 4;
    if constexpr (L::kFive) {
        const uint8_t* qh = blk + 2 + (L::kMin ? 2 : 0);
        q |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
    }
    if constexpr (T == GGMLType::IQ4_NL) return __fmul_rn(d, float(kIq4nl.v[q]));
    if constexpr (L::kMin)
        return __fadd_rn(__fmul_rn(d, float(q)), __half2float(reinterpret_cast<const __half*>(blk)[1]));
    return __fmul_rn(d, float(q - (L::kFive ? 16 : 8)));
}

template <GGMLType T>
__global__ void kv_expand_legacy_kernel(const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                                        __half* __restrict__ kh, __half* __restrict__ vh, int32_t block_size,
                                        int32_t kv_dim, int32_t n_blocks, int32_t n_blk, DeviceBatch b) {
    pdl_wait();
    pdl_trigger();
    const int seq = blockIdx.x / n_blk, j = blockIdx.x % n_blk;
    const int32_t phys = b.block_table[int64_t(seq) * b.max_blocks + j];
    const int64_t n = int64_t(block_size) * kv_dim, i = int64_t(blockIdx.y) * kExpandThreads + threadIdx.x;
    if (phys < 0 || phys >= n_blocks || i >= n) return;
    const int64_t e = phys * n + i, blk = (e / 32) * Legacy<T>::kBytes;
    if (kc) kh[e] = __float2half_rn(legacy_value<T>(kc + blk, int(e % 32)));
    if (vc) vh[e] = __float2half_rn(legacy_value<T>(vc + blk, int(e % 32)));
}

template <class F>
void with_legacy(GGMLType t, F&& f) {
    switch (t) {
        case GGMLType::Q4_0: return f(std::integral_constant<GGMLType, GGMLType::Q4_0>{});
        case GGMLType::Q4_1: return f(std::integral_constant<GGMLType, GGMLType::Q4_1>{});
        case GGMLType::Q5_0: return f(std::integral_constant<GGMLType, GGMLType::Q5_0>{});
        case GGMLType::Q5_1: return f(std::integral_constant<GGMLType, GGMLType::Q5_1>{});
        case GGMLType::IQ4_NL: return f(std::integral_constant<GGMLType, GGMLType::IQ4_NL>{});
        default: fail("cuda kv: ggml type ", uint32_t(t), " is not a q4_0, q4_1, q5_0, q5_1 or iq4_nl cache");
    }
}

}  // namespace

void kv_store_legacy(GGMLType type, uint8_t* k_cache, uint8_t* v_cache, int32_t block_size, int32_t kv_dim,
                     const float* k, const float* v, int32_t n_tok, const DeviceBatch& b, cudaStream_t s) {
    if (n_tok <= 0 || (!k_cache && !v_cache)) return;
    if (kv_dim % 32) fail("cuda kv_store_legacy: a row of ", kv_dim, " values is not whole blocks of 32");
    const int64_t warps = int64_t(n_tok) * 2 * (kv_dim / 32);
    with_legacy(type, [&](auto t) {
        launch_pdl(kv_store_legacy_kernel<decltype(t)::value>, unsigned((warps + 7) / 8), 256, s, k_cache, v_cache,
                   block_size, kv_dim, k, v, n_tok, b);
    });
    EMBER_CUDA_LAUNCHED("kv_store_legacy");
}

void kv_expand_legacy(GGMLType type, const uint8_t* k_cache, const uint8_t* v_cache, __half* k_f16, __half* v_f16,
                      int32_t block_size, int32_t kv_dim, int32_t n_blocks, int32_t n_seq, int32_t n_blk,
                      const DeviceBatch& b, cudaStream_t s) {
    if (n_seq <= 0 || n_blk <= 0 || (!k_cache && !v_cache)) return;
    const int64_t n = int64_t(block_size) * kv_dim;
    const dim3 grid(unsigned(n_seq * n_blk), unsigned((n + kExpandThreads - 1) / kExpandThreads));
    with_legacy(type, [&](auto t) {
        launch_pdl(kv_expand_legacy_kernel<decltype(t)::value>, grid, kExpandThreads, s, k_cache, v_cache, k_f16, v_f16,
                   block_size, kv_dim, n_blocks, n_blk, b);
    });
    EMBER_CUDA_LAUNCHED("kv_expand_legacy");
}

}  // namespace cuda
}  // namespace ember
