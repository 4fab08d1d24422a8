// q8_0 KV cache (layout: src/backend/kv_layout.h): storing new K/V rows, and expanding the blocks a
// batch reads into an f16 copy for the kernels that only read f16 K/V (prompt batches; decode
// over long contexts reads q8_0 directly, attention.cu).
#include "common.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

// One warp per 32-value group of one token's K or V row; rounding as the CPU's q8_0 (d = amax /
// 127, round(x / d) via the reciprocal, half away from zero), so both backends store equal bytes.
// kCaches 2: K and V; 1: kc from k only (the q8_0 cache of a layer whose other cache is f16).
template <int kCaches>
__global__ void kv_store_q8_kernel(uint8_t* __restrict__ kc, uint8_t* __restrict__ vc, int32_t block_size,
                                   int32_t kv_dim, int32_t head_dim, const float* __restrict__ k,
                                   const float* __restrict__ v, int32_t n_tok, DeviceBatch b) {
    pdl_wait();
    pdl_trigger();
    const int groups = kv_dim / 32;
    const int64_t g = int64_t(blockIdx.x) * (blockDim.x / kWarp) + (threadIdx.x >> 5);
    if (g >= int64_t(n_tok) * kCaches * groups) return;
    const int lane = threadIdx.x & 31;
    const int t = int(g / (kCaches * groups)), r = int(g % (kCaches * groups)), is_v = r >= groups, grp = r % groups;
    const int p = b.pos[t];
    const int64_t phys = b.block_table[int64_t(b.seq[t]) * b.max_blocks + p / block_size];
    const int64_t n = int64_t(block_size) * kv_dim;
    uint8_t* base = (is_v ? vc : kc) + phys * (n + n / 16);
    const int hg = head_dim / 32, head = grp / hg;   // head-major: (head, slot, group of the head)
    const int64_t e = (int64_t(head) * block_size + p % block_size) * head_dim + (grp % hg) * 32;
    const float x = (is_v ? v : k)[int64_t(t) * kv_dim + grp * 32 + lane];
    const Q8Scale sc = q8_scale(warp_max(fabsf(x)));
    reinterpret_cast<int8_t*>(base)[e + lane] = int8_t(q8_round(x, sc.id));
    if (lane == 0) reinterpret_cast<__half*>(base + n)[e / 32] = __float2half_rn(sc.d);
}

// grid.x: (sequence, block index < n_blk) of the batch's block tables; grid.y: parts of that
// block. Each thread expands 16 values (one 16-byte load, one scale) of K and of V to f16 at
// their place in an f16-layout copy (row-major: [slot][head][dim]). kCaches 1: kc into kh only.
constexpr int kExpandThreads = 256;

template <int kCaches>
__global__ void kv_expand_q8_kernel(const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                                    __half* __restrict__ kh, __half* __restrict__ vh, int32_t block_size,
                                    int32_t kv_dim, int32_t head_dim, int32_t n_blocks, int32_t n_blk, DeviceBatch b) {
    pdl_wait();
    pdl_trigger();
    const int seq = blockIdx.x / n_blk, j = blockIdx.x % n_blk;
    const int32_t phys = b.block_table[int64_t(seq) * b.max_blocks + j];
    const int64_t n = int64_t(block_size) * kv_dim, i = (int64_t(blockIdx.y) * kExpandThreads + threadIdx.x) * 16;
    if (phys < 0 || phys >= n_blocks || i >= n) return;
    for (int kv = 0; kv < kCaches; ++kv) {
        const uint8_t* src = (kv ? vc : kc) + phys * (n + n / 16);
        const float d = __half2float(reinterpret_cast<const __half*>(src + n)[i / 32]);
        const uint4 raw = *reinterpret_cast<const uint4*>(src + i);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
        uint32_t out[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t word = w[k / 2] >> (16 * (k % 2));
            const __half2 h = __floats2half2_rn(d * float(int8_t(word & 0xFF)), d * float(int8_t((word >> 8) & 0xFF)));
            out[k] = *reinterpret_cast<const uint32_t*>(&h);
        }
        const int64_t head = i / (int64_t(block_size) * head_dim), slot = i / head_dim % block_size;
        uint4* dst = reinterpret_cast<uint4*>((kv ? vh : kh) + phys * n + slot * kv_dim + head * head_dim +
                                              i % head_dim);
        dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
        dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
    }
}

}  // namespace

void kv_store_q8(uint8_t* k_cache, uint8_t* v_cache, int32_t block_size, int32_t kv_dim, int32_t head_dim,
                 const float* k, const float* v, int32_t n_tok, const DeviceBatch& b, cudaStream_t s) {
    // A layer whose caches are of other types (store_mixed) passes none: nothing to store or check.
    if (n_tok <= 0 || (!k_cache && !v_cache)) return;
    if (head_dim % 32) fail("cuda kv_store_q8: head_dim ", head_dim, " is not a multiple of 32");
    if (k_cache && v_cache) {
        const int64_t groups = int64_t(n_tok) * 2 * (kv_dim / 32);
        launch_pdl(kv_store_q8_kernel<2>, unsigned((groups + 7) / 8), 256, s, k_cache, v_cache, block_size, kv_dim,
                   head_dim, k, v, n_tok, b);
    } else if (k_cache || v_cache) {   // the one q8_0 cache goes through the kernel's K half
        const int64_t groups = int64_t(n_tok) * (kv_dim / 32);
        launch_pdl(kv_store_q8_kernel<1>, unsigned((groups + 7) / 8), 256, s, k_cache ? k_cache : v_cache,
                   static_cast<uint8_t*>(nullptr), block_size, kv_dim, head_dim, k_cache ? k : v,
                   static_cast<const float*>(nullptr), n_tok, b);
    } else {
        return;
    }
    EMBER_CUDA_LAUNCHED("kv_store_q8");
}

void kv_expand_q8(const uint8_t* k_cache, const uint8_t* v_cache, __half* k_f16, __half* v_f16, int32_t block_size,
                  int32_t kv_dim, int32_t head_dim, int32_t n_blocks, int32_t n_seq, int32_t n_blk,
                  const DeviceBatch& b, cudaStream_t s) {
    if (n_seq <= 0 || n_blk <= 0) return;
    if (int64_t(block_size) * kv_dim % 256)
        fail("cuda kv_expand_q8: a KV block of ", block_size, " x ", kv_dim, " values is not a multiple of 256");
    const int64_t per_block = int64_t(block_size) * kv_dim / 16;
    const dim3 grid(unsigned(n_seq * n_blk), unsigned((per_block + kExpandThreads - 1) / kExpandThreads));
    if (k_cache && v_cache) {
        launch_pdl(kv_expand_q8_kernel<2>, grid, kExpandThreads, s, k_cache, v_cache, k_f16, v_f16, block_size, kv_dim,
                   head_dim, n_blocks, n_blk, b);
    } else if (k_cache || v_cache) {   // the one q8_0 cache goes through the kernel's K half
        launch_pdl(kv_expand_q8_kernel<1>, grid, kExpandThreads, s, k_cache ? k_cache : v_cache,
                   static_cast<const uint8_t*>(nullptr), k_cache ? k_f16 : v_f16, static_cast<__half*>(nullptr),
                   block_size, kv_dim, head_dim, n_blocks, n_blk, b);
    } else {
        return;
    }
    EMBER_CUDA_LAUNCHED("kv_expand_q8");
}

}  // namespace cuda
}  // namespace ember
