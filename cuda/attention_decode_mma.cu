// Decode attention over a long f16 cache on tensor cores (flash-decoding). One CTA per (token,
// group of up to 16 q heads of one kv head, key range); its warps take turns over tiles of 16
// keys, each warp with its own two-stage copy pipeline (Hopper: tensor copies of whole 16-row
// boxes into an mbarrier; else cp.async), so no warp waits for another before the end.
// Per tile a warp computes S = Q K^T (rows: q heads; K through ldmatrix as the B operand), an
// online softmax in registers, and O += P V (P already in the A layout S came out in; V through
// ldmatrix.trans). The warps' states merge in shared memory at the end; splits > 1 merge as in
// attention_splits.cuh. Q and the probabilities are rounded to f16, as in the other kernels.
// The CUDA-core kernel this replaced (now q8_0 only, attention.cu) spent its issue slots on
// per-key arithmetic and block-wide barriers. Tensor copies (4 per tile, 128-byte swizzle) rather
// than one bulk copy per key row: a tile's completion waits on 4 copies instead of 32, and rows
// need no padding (unpadded rows read through ldmatrix would conflict on banks; the swizzle
// avoids that). Warps and stages: what limits it is how many warps an SM runs, more than how many
// bytes each has in flight, so 6 warps x 2 stages at two CTAs an SM; head dim 256 has rows twice
// as long: half the warps. The shapes and copy forms measured are in docs/performance.md.
#include <cuda.h>   // CUtensorMap (the encoder comes from the runtime's driver entry point)
#include <cudaTypedefs.h>

#include "async_copy.cuh"
#include "attention_splits.cuh"
#include "common.cuh"
#include "kernels.h"
#include "launch.h"
#include "mma.cuh"

namespace ember {
namespace cuda {

namespace {

constexpr int kKeys = 16;   // keys per warp tile: one k-step of P V, two n-tiles of Q K^T

constexpr int kBoxHalves = 64;   // a tile is HD / 64 boxes of [kKeys][64] halves (128-byte rows)

// Shared memory of one warp: kStages tiles of K then V. A tile is HD / 64 boxes of [key][64 dims]
// with 128-byte rows, 16-byte chunk c of row r stored at chunk c ^ (r % 8): the layout the tensor
// copies' 128-byte swizzle writes, in which the 8 rows an ldmatrix reads fall on different banks
// without padding. Boxes start on 1024-byte boundaries (the swizzle's period).
template <int HD>
struct DecodeMmaSmem {
    static constexpr int kWarps = HD <= 128 ? 6 : 3;
    static constexpr int kBoxes = HD / kBoxHalves;
    static constexpr int kBoxBytes = kKeys * 2 * kBoxHalves;
    static constexpr int kTileBytes = kBoxes * kBoxBytes;
    static constexpr int kStages = 2;
    static constexpr int kStageBytes = 2 * kTileBytes;   // K then V
    static constexpr int kWarpBytes = kStages * kStageBytes;
    static constexpr int kAlign = 1024;
    static constexpr int kBytes = kWarps * kWarpBytes + kAlign;   // (room to align the start)
    static_assert(kBoxBytes % kAlign == 0, "boxes keep the swizzle's alignment");
    static_assert(kWarps * kWarpBytes >= kWarps * kDecodeMmaHeads * HD * 4, "the stages double as the merge buffer");
    __device__ static int at(int row, int chunk) {   // bytes
        return (chunk >> 3) * kBoxBytes + row * 2 * kBoxHalves + (((chunk & 7) ^ (row & 7)) << 4);
    }
};

// kTma (Hopper, blocks of a multiple of kKeys rows): a tile is one block's kKeys rows, copied as
// 2 * HD / 64 tensor boxes through tm_k / tm_v (the cache as [rows][kv_dim] halves); else the
// lanes copy 16-byte chunks with cp.async.
template <int HD, bool kTma>
__global__ void __launch_bounds__(DecodeMmaSmem<HD>::kWarps * kWarp)
                                      attention_decode_mma_kernel(AttentionArgs a, DeviceBatch b,
                                                                  const __grid_constant__ CUtensorMap tm_k,
                                                                  const __grid_constant__ CUtensorMap tm_v) {
    using Smem = DecodeMmaSmem<HD>;
    constexpr int kWarps = Smem::kWarps;
    constexpr int kSteps = HD / 16, kDimTiles = HD / 8, kRows = kDecodeMmaHeads;
    extern __shared__ uint4 smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw) +
                    ((Smem::kAlign - smem_addr(smem_raw) % Smem::kAlign) % Smem::kAlign);
    __shared__ float2 ml_s[kWarps][kRows];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ uint64_t full[kWarps][Smem::kStages];   // a stage's bulk copies have landed
#endif
    pdl_trigger();
    const DecodeCta c = decode_cta(a, b, kRows, kKeys);
    const int t = c.t, split = c.split, kvh = c.kvh, h0 = c.h0, n_rows = c.n_rows, len = c.len, lo = c.lo, k0 = c.k0,
              k1 = c.k1;
    const int n_tiles = c.n_tiles;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int kv_dim = a.n_head_kv * HD, q_dim = a.n_head * HD;
    const int n_mine = n_tiles > warp ? (n_tiles - warp + kWarps - 1) / kWarps : 0; // tiles warp, warp + kWarps, ...
    const int32_t* bt = b.block_table + int64_t(b.seq[t]) * b.max_blocks;
    const int bs = a.block_size, bs_shift = __ffs(bs) - 1; // power-of-two blocks (the backend checks)
    uint8_t* wsm = smem + warp * Smem::kWarpBytes;
    auto tile_key0 = [&](int i) { return k0 + (warp + kWarps * i) * kKeys; };

    // The warp's i-th tile. Tensor copies: lanes 0 .. 2 * kBoxes - 1 each copy one box (the
    // rows outside the visible keys [lo, k1) hold whatever the block holds: wait_tile zeroes them
    // in V). cp.async: 16 bytes per request, one group per call; keys outside [lo, k1) copy a
    // visible key's row instead (finite values that get probability 0; a key below a sliding
    // window may lie in a block the cache no longer holds).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (kTma && lane == 0) {
        for (int st = 0; st < Smem::kStages; ++st) mbar_init(&full[warp][st], 1);
        mbar_init_fence();
    }
    __syncwarp();
#endif
    auto issue = [&](int i) {
        if (i < n_mine) {
            uint8_t* st = wsm + (i % Smem::kStages) * Smem::kStageBytes;
            if constexpr (kTma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                uint64_t* bar = &full[warp][i % Smem::kStages];
                if (lane == 0) mbar_arrive_expect_tx(bar, Smem::kStageBytes);
                fence_proxy_async(); // every lane's last reads (and zeroes) of this stage come before the copies
                __syncwarp();
                if (lane < 2 * Smem::kBoxes) {
                    const int key = tile_key0(i), box = lane % Smem::kBoxes, is_v = lane / Smem::kBoxes;
                    const int row = bt[key >> bs_shift] * bs + (key & (bs - 1));
                    tensor_copy_2d_g2s(st + is_v * Smem::kTileBytes + box * Smem::kBoxBytes, is_v ? &tm_v : &tm_k,
                                       kvh * HD + box * kBoxHalves, row, bar);
                }
#endif
            } else {
                constexpr int kChunks = HD / 8, kLanesPerKey = kChunks < kWarp ? kChunks : kWarp;
                constexpr int kKeysPerPass = kWarp / kLanesPerKey;
                const int c = lane % kLanesPerKey;
#pragma unroll
                for (int p = 0; p < kKeys / kKeysPerPass; ++p) {
                    const int r = p * kKeysPerPass + lane / kLanesPerKey, key = tile_key0(i) + r;
                    const int kk = key < k1 && key >= lo ? key : max(k0, lo);
                    const int64_t off = (int64_t(bt[kk >> bs_shift]) * bs + (kk & (bs - 1))) * kv_dim + kvh * HD +
                                        8 * c;
                    cp_async16(st + Smem::at(r, c), a.k_cache + off);
                    cp_async16(st + Smem::kTileBytes + Smem::at(r, c), a.v_cache + off);
                }
            }
        }
        if constexpr (!kTma) cp_async_commit();
    };
    // Waits for the warp's i-th tile. A tensor-copied tile that reaches outside the visible keys:
    // its V rows there are zeroed (they may hold anything, and 0 * inf in P V would be NaN).
    auto wait_tile = [&](int i) {
        if constexpr (kTma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            mbar_wait(&full[warp][i % Smem::kStages], (i / Smem::kStages) & 1);
#endif
            const int v_lo = lo - tile_key0(i), v_hi = k1 - tile_key0(i); // visible rows [v_lo, v_hi)
            if (v_lo > 0 || v_hi < kKeys) {
                uint8_t* vs = wsm + (i % Smem::kStages) * Smem::kStageBytes + Smem::kTileBytes;
                for (int e = lane; e < kKeys * HD / 8; e += kWarp) { // 16-byte chunks, row-major
                    const int r = e / (HD / 8);
                    if (r < v_lo || r >= v_hi)
                        *reinterpret_cast<uint4*>(vs + Smem::at(r, e % (HD / 8))) = make_uint4(0, 0, 0, 0);
                }
            }
        } else {
            cp_async_wait<Smem::kStages - 1>();
        }
        __syncwarp(); // every lane's copies (and zeroes) of tile i are visible to the whole warp
    };
    // The first stages go out before waiting for the previous kernel, except tiles that may hold
    // keys this batch's tokens wrote (the last n_tok positions): the rest of the cache is old.
    const int old_end = len - a.n_tok;
    int n_early = 0;
    while (n_early < Smem::kStages - 1 && (n_early >= n_mine || tile_key0(n_early) + kKeys <= old_end))
        issue(n_early++);
    pdl_wait();
    for (int i = n_early; i < Smem::kStages - 1; ++i) issue(i);

    // Q as A fragments: rows g and g + 8 are heads h0 + g and h0 + g + 8 (zero past n_rows).
    uint32_t qa[kSteps][4];
    {
        const float* q0 = a.q + int64_t(t) * q_dim + int64_t(h0 + g) * HD;
        const float* q1 = q0 + 8 * HD;
        const bool v0 = g < n_rows, v1 = g + 8 < n_rows;
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
            const float2 z = make_float2(0.f, 0.f);
            const float2 x00 = v0 ? *reinterpret_cast<const float2*>(q0 + 16 * s + 2 * tq) : z;
            const float2 x01 = v0 ? *reinterpret_cast<const float2*>(q0 + 16 * s + 2 * tq + 8) : z;
            const float2 x10 = v1 ? *reinterpret_cast<const float2*>(q1 + 16 * s + 2 * tq) : z;
            const float2 x11 = v1 ? *reinterpret_cast<const float2*>(q1 + 16 * s + 2 * tq + 8) : z;
            qa[s][0] = pack_half2(x00.x, x00.y);
            qa[s][1] = pack_half2(x10.x, x10.y);
            qa[s][2] = pack_half2(x01.x, x01.y);
            qa[s][3] = pack_half2(x11.x, x11.y);
        }
    }
    const float qscale = a.scale * kLog2e; // applied to the f16 q.k in f32, as the other kernels do

    float o[kDimTiles][4];
#pragma unroll
    for (int j = 0; j < kDimTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f; // rows g, g + 8 (l: this lane's part)

    for (int i = 0; i < n_mine; ++i) {
        issue(i + Smem::kStages - 1);
        wait_tile(i);
        const uint8_t* ks = wsm + (i % Smem::kStages) * Smem::kStageBytes;
        const uint8_t* vs = ks + Smem::kTileBytes;

        float sc[2][4]; // S: n-tile j holds keys 8j .. 8j + 7
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
            for (int s = 0; s < kSteps; s += 2) {
                uint32_t kb[4]; // B fragments of k-steps s and s + 1
                const int r = 8 * j + (lane & 7);
                ldmatrix_x4(kb, ks + Smem::at(r, 2 * s + (lane >> 3)));
                mma16816(sc[j], qa[s], kb[0], kb[1]);
                mma16816(sc[j], qa[s + 1], kb[2], kb[3]);
            }
        }
        // Online softmax (every tile holds a visible key, so the new maxima are finite).
        const int key_base = tile_key0(i);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = key_base + 8 * j + 2 * tq + e;
                const bool ok = key < k1 && key >= lo;
                sc[j][e] = ok ? softcap_log2(a, sc[j][e] * qscale) : -INFINITY;
                sc[j][2 + e] = ok ? softcap_log2(a, sc[j][2 + e] * qscale) : -INFINITY;
                mx0 = fmaxf(mx0, sc[j][e]);
                mx1 = fmaxf(mx1, sc[j][2 + e]);
            }
        const float2 base = softmax_step(make_float2(mx0, mx1), m0, m1, l0, l1, o);
        uint32_t pa[4]; // P as the A fragment of 16 keys
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const float p0 = exp2f(sc[j][0] - base.x), p1 = exp2f(sc[j][1] - base.x);
            const float p2 = exp2f(sc[j][2] - base.y), p3 = exp2f(sc[j][3] - base.y);
            l0 += p0 + p1;
            l1 += p2 + p3;
            pa[2 * j] = pack_half2(p0, p1);
            pa[2 * j + 1] = pack_half2(p2, p3);
        }
        // O += P V: k = the 16 keys, n = dims; B fragments of dim tiles j and j + 1 per ldmatrix.
#pragma unroll
        for (int j = 0; j < kDimTiles; j += 2) {
            uint32_t vb[4];
            const int r = (lane & 7) + 8 * ((lane >> 3) & 1);
            ldmatrix_x4_trans(vb, vs + Smem::at(r, j + (lane >> 4)));
            mma16816(o[j], pa, vb[0], vb[1]);
            mma16816(o[j + 1], pa, vb[2], vb[3]);
        }
        __syncwarp(); // the stage is refilled by the next issue
    }
    if constexpr (!kTma) cp_async_wait<0>(); // (only empty groups remain)
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

    // Merge the warps: their stages become [warp][row][dim] floats.
    __syncthreads();
    float* ob = reinterpret_cast<float*>(smem); // (the stages, all read)
    float* mine = ob + warp * kRows * HD;
#pragma unroll
    for (int j = 0; j < kDimTiles; ++j) {
        *reinterpret_cast<float2*>(mine + g * HD + 8 * j + 2 * tq) = make_float2(o[j][0], o[j][1]);
        *reinterpret_cast<float2*>(mine + (g + 8) * HD + 8 * j + 2 * tq) = make_float2(o[j][2], o[j][3]);
    }
    if (tq == 0) {
        ml_s[warp][g] = make_float2(m0, l0);
        ml_s[warp][g + 8] = make_float2(m1, l1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_rows * HD; e += kWarps * kWarp) {
        const int r = e / HD, d = e % HD;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) m = fmaxf(m, ml_s[w][r].x);
        float l = 0.f, acc = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const float wt = ml_s[w][r].x == -INFINITY ? 0.f : exp2f(ml_s[w][r].x - m);
            l += ml_s[w][r].y * wt;
            acc += ob[(w * kRows + r) * HD + d] * wt;
        }
        const int64_t th = int64_t(t) * a.n_head + h0 + r;
        if (a.n_split == 1) {
            const float sum = l + sink_term(a, h0 + r, m);
            store_out(a, th * HD + d, sum > 0.f ? acc / sum : 0.f);
        } else {
            const int64_t slot = int64_t(split) * a.n_tok * a.n_head + th;
            a.part_acc[slot * HD + d] = acc;
            if (d == 0) a.part_ml[slot] = make_float2(m, l);
        }
    }
    if (a.n_split == 1 || !last_of_splits(a)) return;
    for (int e = threadIdx.x; e < n_rows * HD; e += kWarps * kWarp) {
        const int64_t th = int64_t(t) * a.n_head + h0 + e / HD;
        store_out(a, th * HD + e % HD, merge_splits(a, th, e % HD));
    }
}

// The driver's tensor-map encoder, reached through the runtime (no link to the driver library);
// null where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                                               &q);
#else
        const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q);
#endif
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            p = nullptr;
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// The cache as [cache_rows][kv_dim] halves in boxes of [kKeys][64] with the 128-byte swizzle;
// false where the encoder or the cache's alignment does not allow it.
bool encode_cache_map(CUtensorMap* map, const __half* cache, const AttentionArgs& a) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode || reinterpret_cast<uintptr_t>(cache) % 16 != 0) return false;
    const cuuint64_t kv_dim = cuuint64_t(a.n_head_kv) * a.head_dim;
    const cuuint64_t dims[2] = {kv_dim, cuuint64_t(a.cache_rows)};
    const cuuint64_t strides[1] = {kv_dim * 2};
    const cuuint32_t box[2] = {kBoxHalves, kKeys};
    const cuuint32_t elem_strides[2] = {1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<__half*>(cache), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Tensor copies need Hopper and tiles that never cross a block.
bool tma_capable(const AttentionArgs& a) { return device_is_sm90() && a.block_size % kKeys == 0 && a.cache_rows > 0; }

template <int HD, bool kTma>
void launch_kernel(const AttentionArgs& a, const DeviceBatch& b, dim3 grid, const CUtensorMap& tm_k,
                   const CUtensorMap& tm_v, cudaStream_t s) {
    const size_t smem = DecodeMmaSmem<HD>::kBytes;
    static bool opted_in = false; // above 48 KB of dynamic shared memory needs the opt-in
    if (!opted_in) {
        EMBER_CUDA_CHECK(cudaFuncSetAttribute(attention_decode_mma_kernel<HD, kTma>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        opted_in = true;
    }
    launch_pdl_smem(attention_decode_mma_kernel<HD, kTma>, grid, dim3(DecodeMmaSmem<HD>::kWarps * kWarp), smem, s, a, b,
                    tm_k, tm_v);
}

template <int HD>
void launch(const AttentionArgs& a, const DeviceBatch& b, dim3 grid, cudaStream_t s) {
    CUtensorMap tm_k{}, tm_v{};
    if (tma_capable(a) && encode_cache_map(&tm_k, a.k_cache, a) && encode_cache_map(&tm_v, a.v_cache, a))
        launch_kernel<HD, true>(a, b, grid, tm_k, tm_v, s);
    else launch_kernel<HD, false>(a, b, grid, tm_k, tm_v, s);
}

} // namespace

void attention_decode_mma(const AttentionArgs& a, const DeviceBatch& b, cudaStream_t s) {
    if (a.n_tok == 0) return;
    const int n_hchunks = (a.n_head / a.n_head_kv + kDecodeMmaHeads - 1) / kDecodeMmaHeads;
    const dim3 grid(unsigned(a.n_tok), unsigned(a.n_head_kv * n_hchunks), unsigned(a.n_split));
    switch (a.head_dim) {
        case 64: launch<64>(a, b, grid, s); break;
        case 128: launch<128>(a, b, grid, s); break;
        case 256: launch<256>(a, b, grid, s); break;
        default: fail("cuda attention_decode_mma: head_dim ", a.head_dim, " is not 64, 128 or 256");
    }
    EMBER_CUDA_LAUNCHED("attention_decode_mma");
}

} // namespace cuda
} // namespace ember
