// Prompt attention on tensor cores (FlashAttention-2 style, mma.sync m16n8k16 f16 -> f32):
// a CTA of 4 warps takes 64 consecutive tokens of one sequence (16 query rows per warp) and
// one q head, and streams that sequence's keys in tiles of 64 from the paged f16 cache
// through shared memory (from the tile holding the first key a sliding window lets it see).
// Scores stay in registers (online softmax), no n x n matrix exists. Head dims 64 and 128;
// others use the CUDA-core kernel in attention.cu.
#include "attention_splits.cuh"
#include "common.cuh"
#include "kernels.h"
#include "mma.cuh"

namespace ember {
namespace cuda {

namespace {

constexpr int kWarps = 4;            // 16 query rows each: 64 tokens per CTA (kMmaTileLen)
constexpr int kKTile = 64;            // keys per shared-memory tile
static_assert(16 * kWarps == kMmaTileLen, "a CTA's warps cover one token tile");

template <int HD>
__global__ void __launch_bounds__(kWarps * kWarp) attention_mma_kernel(AttentionArgs a, DeviceBatch b) {
    constexpr int kStride = HD + 8;        // halves per smem row: 16-byte pad, no ldmatrix bank conflicts
    constexpr int kSteps = HD / 16;        // k-steps of Q.K^T
    constexpr int kDimTiles = HD / 8;      // n-tiles of the output
    __shared__ __align__(16) __half ks[kKTile][kStride];
    __shared__ __align__(16) __half vs[kKTile][kStride];

    const AttnTile tile = a.tiles[blockIdx.x];
    const int h = blockIdx.y;
    const int kvh = h / (a.n_head / a.n_head_kv);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int q_dim = a.n_head * HD, kv_dim = a.n_head_kv * HD;

    // This warp's rows: tokens tile.first + 16 * warp + {g, g + 8}.
    const int r0 = 16 * warp + g, r1 = r0 + 8;
    const int pos0 = r0 < tile.count ? b.pos[tile.first + r0] : -1;
    const int pos1 = r1 < tile.count ? b.pos[tile.first + r1] : -1;
    int max_pos = -1, min_pos = 0x7fffffff;
    for (int i = 0; i < tile.count; ++i) {
        max_pos = max(max_pos, b.pos[tile.first + i]);
        min_pos = min(min_pos, b.pos[tile.first + i]);
    }
    // Sliding window or chunks: row r sees keys low_r .. pos_r; the CTA starts at the tile of keys
    // holding the first key any of its rows sees (first keys do not fall as positions rise).
    const int low0 = attention_first_key(a, pos0), low1 = attention_first_key(a, pos1);
    const int key_lo = attention_first_key(a, min_pos);
    // The warp's last and first visible keys: warp-uniform, so the .aligned mma / ldmatrix never diverge.
    const int warp_pos = __reduce_max_sync(0xffffffffu, max(pos0, pos1));
    const int warp_low = __reduce_min_sync(0xffffffffu,
                                           min(pos0 >= 0 ? low0 : 0x7fffffff, pos1 >= 0 ? low1 : 0x7fffffff));

    uint32_t qa[kSteps][4];
    {
        const float qs = a.scale * kLog2e;   // scores come out in the log2 domain
        const float* q0 = a.q + int64_t(tile.first + r0) * q_dim + h * HD;
        const float* q1 = a.q + int64_t(tile.first + r1) * q_dim + h * HD;
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
            float2 x00 = make_float2(0.f, 0.f), x01 = x00, x10 = x00, x11 = x00;
            if (pos0 >= 0) {
                x00 = *reinterpret_cast<const float2*>(q0 + 16 * s + 2 * t);
                x01 = *reinterpret_cast<const float2*>(q0 + 16 * s + 2 * t + 8);
            }
            if (pos1 >= 0) {
                x10 = *reinterpret_cast<const float2*>(q1 + 16 * s + 2 * t);
                x11 = *reinterpret_cast<const float2*>(q1 + 16 * s + 2 * t + 8);
            }
            qa[s][0] = pack_half2(x00.x * qs, x00.y * qs);
            qa[s][1] = pack_half2(x10.x * qs, x10.y * qs);
            qa[s][2] = pack_half2(x01.x * qs, x01.y * qs);
            qa[s][3] = pack_half2(x11.x * qs, x11.y * qs);
        }
    }

    float o[kDimTiles][4];
#pragma unroll
    for (int j = 0; j < kDimTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    const int32_t* bt = b.block_table + int64_t(b.seq[tile.first]) * b.max_blocks;
    const int bs = a.block_size;
    const int n_keys = max_pos + 1;
    for (int k0 = key_lo / kKTile * kKTile; k0 < n_keys; k0 += kKTile) {
        __syncthreads();   // the previous tile is consumed
        constexpr int kChunks = kKTile * HD / 8;   // 16-byte pieces of a tile
        for (int c = threadIdx.x; c < kChunks; c += kWarps * kWarp) {
            const int key = c / (HD / 8), part = c % (HD / 8);
            const int kk = k0 + key;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
            if (kk < n_keys && kk >= key_lo) {   // (a key below every row's window may be in a freed block)
                const int64_t off = (int64_t(bt[kk / bs]) * bs + kk % bs) * kv_dim + kvh * HD + 8 * part;
                kv = *reinterpret_cast<const uint4*>(a.k_cache + off);
                vv = *reinterpret_cast<const uint4*>(a.v_cache + off);
            }
            *reinterpret_cast<uint4*>(&ks[key][8 * part]) = kv;
            *reinterpret_cast<uint4*>(&vs[key][8 * part]) = vv;
        }
        __syncthreads();
        // Every key of this tile is in the future of this warp's rows, or below their windows.
        if (warp_pos < k0 || warp_low >= k0 + kKTile) continue;

        // S = Q K^T for this warp's 16 rows x 64 keys (8 n-tiles).
        float sc[kKTile / 8][4];
#pragma unroll
        for (int j = 0; j < kKTile / 8; ++j) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
            for (int s = 0; s < kSteps; s += 2) {
                uint32_t kb[4];   // B fragments of k-steps s and s+1
                ldmatrix_x4(kb, &ks[8 * j + (lane & 7)][16 * s + 8 * (lane >> 3)]);
                mma16816(sc[j], qa[s], kb[0], kb[1]);
                mma16816(sc[j], qa[s + 1], kb[2], kb[3]);
            }
        }
        // Causal and window mask, online softmax (rows g and g + 8; a row lives in one lane quad).
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKTile / 8; ++j) {
            const int key = k0 + 8 * j + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[j][e] = softcap_log2(a, sc[j][e]);
            if (key > pos0 || key < low0) sc[j][0] = -INFINITY;
            if (key + 1 > pos0 || key + 1 < low0) sc[j][1] = -INFINITY;
            if (key > pos1 || key < low1) sc[j][2] = -INFINITY;
            if (key + 1 > pos1 || key + 1 < low1) sc[j][3] = -INFINITY;
            mx0 = fmaxf(mx0, fmaxf(sc[j][0], sc[j][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[j][2], sc[j][3]));
        }
        const float2 base = softmax_step(make_float2(mx0, mx1), m0, m1, l0, l1, o);
        uint32_t pa[kKTile / 16][4];   // P as A fragments, one per 16 keys
#pragma unroll
        for (int j = 0; j < kKTile / 8; ++j) {
            const float p0 = exp2f(sc[j][0] - base.x), p1 = exp2f(sc[j][1] - base.x);
            const float p2 = exp2f(sc[j][2] - base.y), p3 = exp2f(sc[j][3] - base.y);
            l0 += p0 + p1;
            l1 += p2 + p3;
            pa[j / 2][(j & 1) * 2 + 0] = pack_half2(p0, p1);
            pa[j / 2][(j & 1) * 2 + 1] = pack_half2(p2, p3);
        }
        // O += P V: k = keys (4 steps of 16), n = dims.
#pragma unroll
        for (int s = 0; s < kKTile / 16; ++s) {
#pragma unroll
            for (int j = 0; j < kDimTiles; j += 2) {
                uint32_t vb[4];   // B fragments of dim tiles j and j+1
                ldmatrix_x4_trans(vb, &vs[16 * s + (lane & 7) + 8 * ((lane >> 3) & 1)][8 * j + 8 * (lane >> 4)]);
                mma16816(o[j], pa[s], vb[0], vb[1]);
                mma16816(o[j + 1], pa[s], vb[2], vb[3]);
            }
        }
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    l0 += sink_term(a, h, m0);
    l1 += sink_term(a, h, m1);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    float* out0 = a.out + int64_t(tile.first + r0) * q_dim + h * HD;
    float* out1 = a.out + int64_t(tile.first + r1) * q_dim + h * HD;
#pragma unroll
    for (int j = 0; j < kDimTiles; ++j) {
        if (pos0 >= 0) *reinterpret_cast<float2*>(out0 + 8 * j + 2 * t) = make_float2(o[j][0] * inv0, o[j][1] * inv0);
        if (pos1 >= 0) *reinterpret_cast<float2*>(out1 + 8 * j + 2 * t) = make_float2(o[j][2] * inv1, o[j][3] * inv1);
    }
}

}  // namespace

bool attention_prefill_mma(const AttentionArgs& a, const DeviceBatch& b, cudaStream_t s) {
    if (a.head_dim != 64 && a.head_dim != 128) return false;
    if (a.n_tiles == 0) return true;
    const dim3 grid(unsigned(a.n_tiles), unsigned(a.n_head));
    if (a.head_dim == 64) attention_mma_kernel<64><<<grid, kWarps * kWarp, 0, s>>>(a, b);
    else attention_mma_kernel<128><<<grid, kWarps * kWarp, 0, s>>>(a, b);
    EMBER_CUDA_LAUNCHED("attention_mma");
    return true;
}

}  // namespace cuda
}  // namespace ember
