// Quantized GEMM for batches of kMaxGemvTokens < n_tok <= kMaxGemmQ8Tokens (continuous-batching
// decode steps, short prompts): y [n_tok][n_out] = x W^T for the packed 32-element block formats
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL; weight_pack.h) against q8_1 activations, on int8 tensor cores
// (mma.sync m16n8k32). A 32-block's int32 dot is exact and is scaled as the GEMV scales it
// (d_w * d_x, + m_w * s_x for the *_1 formats), so the two differ only in the float summation order.
//
// CTA tile: kBM = 128 weight rows x BN = 16 * NJ tokens (16, 32 or 64); 8 warps, 4 along the rows
// x 2 along the tokens, a warp 32 rows (two m16 tiles) x 8 * NJ tokens (NJ n8 tiles; two CTAs of
// 128 registers a thread fit an SM). The row dimension is the mma's M, so the weight tile is read
// from global memory once per CTA and used for all BN tokens (more tokens: more token tiles, whose
// CTAs run together); a warp whose tokens all lie past n_tok skips the math. K runs through a kStages-deep cp.async pipeline of
// kKS blocks (128 elements) a stage. A stage in shared memory:
//   weight quants [kBM][kKS * QB + 16]  QB = 16 (nibbles) or 32 (Q8_0) bytes a block; the 16-byte
//                                       pad puts the 8 rows of an ldmatrix in distinct banks
//   weight meta   [kBM][MCH * 16]       the 16-byte chunks of the meta region holding the row's
//                                       kKS entries, which start at byte (offset & 15) of the first
//   x quants      [BN][kKS * 32 + 16]
//   x ds          [kKS][BN] float2      (d, d * sum q): tokens 2t and 2t + 1 are one 16-byte load
// Grid: x = K splits, y = token tiles, z = row tiles, so the CTAs reading one weight tile run
// together and its later reads come from L2. With more than one split (Hopper) the
// splits of a tile are one thread-block cluster: each CTA leaves its partial tile in shared memory
// and the cluster sums the partials in rank order through distributed shared memory (no
// workspace, and the result does not depend on timing).
#include <cooperative_groups.h>

#include <algorithm>

#include "async_copy.cuh"
#include "block_decode.cuh"
#include "common.cuh"
#include "gemv_legacy.cuh"
#include "kernels.h"
#include "launch.h"
#include "mma.cuh"

namespace ember {
namespace cuda {

namespace {

constexpr int kBM = 128; // weight rows a CTA
constexpr int kKS = 4; // 32-element blocks a pipeline stage
constexpr int kStages = 4;
constexpr int kThreads = 256; // 8 warps: 4 along the rows x 2 along the tokens
constexpr int kMaxSplit = 8; // K splits of a tile: the portable cluster size

// The formats, over their block decoders (block_decode.cuh). operands(): from word t of a
// block's 16 nibble bytes and the block's high bits (Q5), the int8 A-operand words of groups t
// (elements 4t..4t+3, lo) and t + 4 (4t+16..4t+19, hi), as kScale^-1 times the quants (the scale
// folds the factor back: a power of two, so each block's product d_w * d_x * sum has the GEMV's
// bits). meta(): the block's d, m and qh from its metadata entry.
template <class D>
struct GemmFormat {
    static constexpr int kQB = D::kQuantBytes, kMB = int(sizeof(typename D::Meta));
    static constexpr bool kMin = D::kHasMin;
    __device__ __forceinline__ static void meta(const uint8_t* p, float& d, float& m, uint32_t& qh) {
        const typename D::Meta v = *reinterpret_cast<const typename D::Meta*>(p);
        d = D::d(v);
        m = D::m(v);
        qh = D::qh(v);
    }
};

struct GemmQ4_0 : GemmFormat<DecodeQ4_0> {
    static constexpr float kScale = 1.f / 16;
    // 16 * (q - 8): the nibble in the byte's high half with the sign bit flipped (fewer operations
    // than the decoder's q - 8 shifted; |16 * (q - 8)| <= 128 keeps the int32 sums below 2^22, see
    // small_int_to_float).
    __device__ static void operands(uint32_t w, uint32_t, int, uint32_t& lo, uint32_t& hi) {
        lo = ((w << 4) & 0xF0F0F0F0u) ^ 0x80808080u;
        hi = (w & 0xF0F0F0F0u) ^ 0x80808080u;
    }
};

struct GemmQ4_1 : GemmFormat<DecodeQ4_1> {
    static constexpr float kScale = 1.f;
    __device__ static void operands(uint32_t w, uint32_t qh, int t, uint32_t& lo, uint32_t& hi) {
        lo = DecodeQ4_1::quants(w, t, qh);
        hi = DecodeQ4_1::quants(w, t + 4, qh);
    }
};

// Q5_0: 8 * (q - 16) by the same trick as Q4_0 (q <= 31, so q << 3 stays inside its byte); Q5_1: q.
template <bool kHasMin>
struct GemmQ5 : GemmFormat<DecodeQ5<kHasMin>> {
    using D = DecodeQ5<kHasMin>;
    static constexpr float kScale = kHasMin ? 1.f : 1.f / 8;
    __device__ static void operands(uint32_t w, uint32_t qh, int t, uint32_t& lo, uint32_t& hi) {
        lo = D::quants(w, t, qh);
        hi = D::quants(w, t + 4, qh);
        if (!kHasMin) {
            lo = (lo << 3) ^ 0x80808080u;
            hi = (hi << 3) ^ 0x80808080u;
        }
    }
};

// MXFP4 / IQ4_NL: the table values, signed bytes (|v| <= 127).
template <bool kMx>
struct GemmTable4 : GemmFormat<DecodeTable4<kMx>> {
    static constexpr float kScale = 1.f;
    __device__ static void operands(uint32_t w, uint32_t qh, int t, uint32_t& lo, uint32_t& hi) {
        lo = uint32_t(DecodeTable4<kMx>::values(w, t, qh));
        hi = uint32_t(DecodeTable4<kMx>::values(w, t + 4, qh));
    }
};

// Q8_0: the quants are the A operand as they are (read with ldmatrix, no operands()).
struct GemmQ8_0 : GemmFormat<DecodeQ8_0> {
    static constexpr float kScale = 1.f;
};

// Shared-memory layout of one format and token tile (byte offsets within a stage).
template <class F, int NJ>
struct Layout {
    static constexpr int kBN = 16 * NJ;
    static constexpr int kWRow = kKS * F::kQB + 16;
    static constexpr int kMRow = 16 * ((kKS * F::kMB + 30) / 16); // covers any start offset 0..15
    static constexpr int kXRow = kKS * 32 + 16;
    static constexpr int kW = 0, kM = kW + kBM * kWRow, kX = kM + kBM * kMRow, kD = kX + kBN * kXRow;
    static constexpr int kStage = kD + kKS * kBN * 8;
    static constexpr int kAccRow = kBM + 4; // floats; the +4 spreads a warp's fragment stores over 32 banks
    static constexpr int kSmem = std::max(kStages * kStage, kBN * kAccRow * 4);
};

struct Params {
    const uint8_t* wq; // quants region
    const uint8_t* meta; // meta region
    const int8_t* xq; // [n_tok][n_blocks * 32]
    const float2* xds; // [n_tok][n_blocks]
    float* y; // [n_tok][n_out]
    int32_t n_blocks, n_out, n_tok;
    int32_t split_blocks; // blocks of one K split, a multiple of kKS
};

template <class F, int NJ>
__global__ void __launch_bounds__(kThreads, 2) gemm_q8_kernel(Params p) {
    using L = Layout<F, NJ>;
    constexpr int kBN = L::kBN;
    extern __shared__ uint4 smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wrow = (warp & 3) * 32, wtok = (warp >> 2) * (kBN / 2); // the warp's first row and token
    const int tok0 = int(blockIdx.y) * kBN, row0 = int(blockIdx.z) * kBM;
    const int nb = p.n_blocks;
    const int kb_begin = int(blockIdx.x) * p.split_blocks, kb_end = min(nb, kb_begin + p.split_blocks);
    const int n_st = kb_end > kb_begin ? (kb_end - kb_begin + kKS - 1) / kKS : 0;
    pdl_trigger();

    // Stage s <- blocks kb0..kb0+kKS-1 (zeros past kb_end, past n_out rows and past n_tok tokens:
    // a zero block adds 0 to every sum). A thread's copies are the slots tid + k * kThreads, k in a
    // compile-time range (the last slots stop early where they do not divide the copies), so
    // their row and token offsets stay put across the K loop.
    constexpr int kQChunks = kKS * F::kQB / 16, kMChunks = L::kMRow / 16; // 16-byte chunks of a row's stage
    auto load_weights = [&](int s, int kb0) {
        uint8_t* st = smem + s * L::kStage;
        const int n_kb = kb_end - kb0;
#pragma unroll
        for (int k = 0; k < (kBM * kQChunks + kThreads - 1) / kThreads; ++k) {
            const int i = tid + k * kThreads, r = i / kQChunks, c = i % kQChunks;
            if (kBM * kQChunks % kThreads != 0 && i >= kBM * kQChunks) break;
            const bool ok = row0 + r < p.n_out && c / (F::kQB / 16) < n_kb;
            const uint8_t* src = p.wq + (ok ? (int64_t(row0 + r) * nb + kb0) * F::kQB + 16 * c : 0);
            cp_async16_zfill_l2_256(st + L::kW + r * L::kWRow + 16 * c, src, ok);
        }
        const int n_bytes = min(kKS, n_kb) * F::kMB;
#pragma unroll
        for (int k = 0; k < (kBM * kMChunks + kThreads - 1) / kThreads; ++k) {
            const int i = tid + k * kThreads, r = i / kMChunks, c = i % kMChunks;
            if (kBM * kMChunks % kThreads != 0 && i >= kBM * kMChunks) break;
            const int64_t start = (int64_t(row0 + r) * nb + kb0) * F::kMB, chunk = (start & ~int64_t(15)) + 16 * c;
            const bool ok = row0 + r < p.n_out && chunk < start + n_bytes;
            cp_async16_zfill(st + L::kM + r * L::kMRow + 16 * c, p.meta + (ok ? chunk : 0), ok);
        }
    };
    auto load_x = [&](int s, int kb0) {
        uint8_t* st = smem + s * L::kStage;
        const int n_kb = kb_end - kb0;
#pragma unroll
        for (int k = 0; k < (kBN * kKS * 2 + kThreads - 1) / kThreads; ++k) {
            const int i = tid + k * kThreads, tk = i / (kKS * 2), c = i % (kKS * 2);
            if (kBN * kKS * 2 % kThreads != 0 && i >= kBN * kKS * 2) break;
            const bool ok = tok0 + tk < p.n_tok && c / 2 < n_kb;
            const int8_t* src = p.xq + (ok ? (int64_t(tok0 + tk) * nb + kb0) * 32 + 16 * c : 0);
            cp_async16_zfill(st + L::kX + tk * L::kXRow + 16 * c, src, ok);
        }
#pragma unroll
        for (int k = 0; k < (kBN * kKS + kThreads - 1) / kThreads; ++k) { // consecutive threads: one token's blocks
            const int i = tid + k * kThreads, tk = i / kKS, kk = i % kKS;
            if (kBN * kKS % kThreads != 0 && i >= kBN * kKS) break;
            const bool ok = tok0 + tk < p.n_tok && kk < n_kb;
            cp_async8_zfill(st + L::kD + (kk * kBN + tk) * 8, p.xds + (ok ? int64_t(tok0 + tk) * nb + kb0 + kk : 0),
                            ok);
        }
    };

    // Weights do not depend on the previous kernel: their first stages go out before pdl_wait.
    for (int s = 0; s < kStages - 1; ++s)
        if (s < n_st) load_weights(s, kb_begin + s * kKS);
    pdl_wait();
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_st) load_x(s, kb_begin + s * kKS);
        cp_async_commit();
    }

    float acc[2][NJ][4] = {};
    const int nj_valid = min(NJ, max(0, (p.n_tok - tok0 - wtok + 7) / 8));
    const int row_phase = (nb * F::kMB) & 15; // a row's meta offset mod 16 grows by this per row
    for (int ks = 0; ks < n_st; ++ks) {
        cp_async_wait<kStages - 2>();
        __syncthreads(); // stage ks landed for every thread; stage ks - 1 is free for the prefetch
        const int pre = ks + kStages - 1;
        if (pre < n_st) {
            load_weights(pre % kStages, kb_begin + pre * kKS);
            load_x(pre % kStages, kb_begin + pre * kKS);
        }
        cp_async_commit();
        if (nj_valid == 0) continue;
        const int kb0 = kb_begin + ks * kKS;
        const uint8_t* st = smem + (ks % kStages) * L::kStage;
        const float2* ds_s = reinterpret_cast<const float2*>(st + L::kD);
        const uint8_t* meta_row[2][2]; // [m16 tile][row g, g + 8]: the entry of block kb0
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wrow + 16 * i + 8 * h + g;
                meta_row[i][h] = st + L::kM + r * L::kMRow + (((row0 + r) * row_phase + kb0 * F::kMB) & 15);
            }
#pragma unroll
        for (int kp = 0; kp < kKS; kp += 2) { // blocks kp and kp + 1
            // Nibble formats: one ldmatrix.x4 a m16 tile holds both blocks, matrices (rows 0-7, kp),
            // (8-15, kp), (0-7, kp + 1), (8-15, kp + 1): word t of rows g and g + 8. Lanes 8q..8q+7
            // address matrix q's rows, rows 8 * (q & 1) + (lane & 7) of the tile.
            const uint8_t* arow[2];
            uint32_t q[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                arow[i] = st + L::kW + (wrow + 16 * i + 8 * ((lane >> 3) & 1) + (lane & 7)) * L::kWRow;
                if constexpr (F::kQB == 16) ldmatrix_x4(q[i], arow[i] + (kp + (lane >> 4)) * 16);
            }
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int kb = kp + e;
                float d[2][2], m[2][2] = {}; // [m16 tile][row g, g + 8]
                uint32_t a[2][4];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    uint32_t qh[2] = {};
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        F::meta(meta_row[i][h] + kb * F::kMB, d[i][h], m[i][h], qh[h]);
                        d[i][h] *= F::kScale;
                    }
                    if constexpr (F::kQB == 16) {
                        F::operands(q[i][2 * e], qh[0], t, a[i][0], a[i][2]);
                        F::operands(q[i][2 * e + 1], qh[1], t, a[i][1], a[i][3]);
                    } else { // Q8_0: (rows 0-7, bytes 0-15), (8-15, 0-15), (0-7, 16-31), (8-15, 16-31)
                        ldmatrix_x4(a[i], arow[i] + kb * 32 + (lane >> 4) * 16);
                    }
                }
#pragma unroll
                for (int j = 0; j < NJ;
                     ++j) { // (no early exit: the next tile's loads and mmas overlap this one's sums)
                    // matrices (tokens 0-7 of the n8 tile, bytes 0-15), (bytes 16-31); lanes 16-31
                    // repeat the addresses of lanes 0-15
                    uint32_t b[2];
                    ldmatrix_x2(b,
                                st + L::kX + (wtok + 8 * j + (lane & 7)) * L::kXRow + kb * 32 + ((lane >> 3) & 1) * 16);
                    const float4 ds = *reinterpret_cast<const float4*>(ds_s + kb * kBN + wtok + 8 * j + 2 * t);
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        int c[4] = {0, 0, 0, 0};
                        mma16832_s8(c, a[i], b[0], b[1]);
                        // c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8
                        float* o = acc[i][j];
                        o[0] = fmaf(small_int_to_float(c[0]), d[i][0] * ds.x, o[0]);
                        o[1] = fmaf(small_int_to_float(c[1]), d[i][0] * ds.z, o[1]);
                        o[2] = fmaf(small_int_to_float(c[2]), d[i][1] * ds.x, o[2]);
                        o[3] = fmaf(small_int_to_float(c[3]), d[i][1] * ds.z, o[3]);
                        if constexpr (F::kMin) {
                            o[0] = fmaf(m[i][0], ds.y, o[0]);
                            o[1] = fmaf(m[i][0], ds.w, o[1]);
                            o[2] = fmaf(m[i][1], ds.y, o[2]);
                            o[3] = fmaf(m[i][1], ds.w, o[3]);
                        }
                    }
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // The CTA's (partial) tile, [token][row], over the pipeline's shared memory.
    float* tile = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
            store_acc_transposed(tile, L::kAccRow, wrow + 16 * i + g, wtok + 8 * j + 2 * t, acc[i][j]);
    const int n_tk = min(kBN, p.n_tok - tok0), n_r = min(kBM, p.n_out - row0);
    const int n_split = int(gridDim.x);
    // Consecutive threads take consecutive rows of a token: coalesced stores of y.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (n_split > 1) {
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync(); // every partial tile written
        for (int e = int(cluster.block_rank()) * kThreads + tid; e < n_tk * kBM; e += n_split * kThreads) {
            const int tk = e / kBM, r = e % kBM;
            if (r >= n_r) continue;
            float sum = 0.f;
            for (int q = 0; q < n_split; ++q) sum += cluster.map_shared_rank(tile, q)[tk * L::kAccRow + r];
            p.y[int64_t(tok0 + tk) * p.n_out + row0 + r] = sum;
        }
        cluster.sync(); // no CTA leaves while another reads its shared memory
        return;
    }
#endif
    __syncthreads();
    for (int e = tid; e < n_tk * kBM; e += kThreads) {
        const int tk = e / kBM, r = e % kBM;
        if (r < n_r) p.y[int64_t(tok0 + tk) * p.n_out + row0 + r] = tile[tk * L::kAccRow + r];
    }
}

// K splits for a grid of `tiles` CTAs a split, `slots` CTAs resident at once and k_stages
// pipeline stages a row: the fewest splits within 10% of the best time in waves (a split adds a
// reduction), each split keeping at least two stages.
int pick_split(int64_t tiles, int64_t slots, int k_stages) {
    int best = 1;
    double best_t = double((tiles + slots - 1) / slots);
    for (int s = 2; s <= kMaxSplit && 2 * s <= k_stages; ++s) {
        const double t_s = double((tiles * s + slots - 1) / slots) / s;
        if (t_s < 0.9 * best_t) {
            best = s;
            best_t = t_s;
        }
    }
    return best;
}

template <class F, int NJ>
void launch(const DeviceWeight& w, float* y, const int8_t* xq, const float2* xds, int32_t n_tok, cudaStream_t s) {
    using L = Layout<F, NJ>;
    auto* kernel = gemm_q8_kernel<F, NJ>;
    static const int per_sm = [kernel] { // above 48 KB of dynamic shared memory needs the opt-in
        EMBER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmem));
        int n = 0;
        EMBER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, L::kSmem));
        return std::max(n, 1);
    }();
    int dev = 0, sms = 0;
    EMBER_CUDA_CHECK(cudaGetDevice(&dev));
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    Params p{w.base, w.base + w.layout.meta_off, xq, xds, y, int32_t(w.layout.n_blocks), int32_t(w.n_out), n_tok, 0};
    const int64_t m_tiles = (w.n_out + kBM - 1) / kBM, n_tiles = (n_tok + L::kBN - 1) / L::kBN;
    const int k_stages = int((p.n_blocks + kKS - 1) / kKS);
    // Splits are summed through a cluster's distributed shared memory (Hopper); one split before.
    const int split = device_is_sm90() ? pick_split(m_tiles * n_tiles, int64_t(sms) * per_sm, k_stages) : 1;
    p.split_blocks = kKS * ((k_stages + split - 1) / split);
    launch_pdl_cluster(kernel, dim3(unsigned(split), unsigned(n_tiles), unsigned(m_tiles)), dim3(kThreads),
                       size_t(L::kSmem), unsigned(split), s, p);
    EMBER_CUDA_LAUNCHED("gemm_q8");
}

template <class F>
void launch_tokens(const DeviceWeight& w, float* y, const int8_t* xq, const float2* xds, int32_t n_tok,
                   cudaStream_t s) {
    if (n_tok <= 16) launch<F, 1>(w, y, xq, xds, n_tok, s);
    else if (n_tok <= 32) launch<F, 2>(w, y, xq, xds, n_tok, s);
    else launch<F, 4>(w, y, xq, xds, n_tok, s);
}

} // namespace

void gemm_q8(const DeviceWeight& w, float* y, const int8_t* xq, const float2* xds, int32_t n_tok, cudaStream_t s) {
    if (n_tok <= 0) return;
    if (n_tok > kMaxGemmQ8Tokens) fail("cuda gemm_q8: n_tok ", n_tok, " is above ", kMaxGemmQ8Tokens);
    switch (w.type) {
        case GGMLType::Q4_0: launch_tokens<GemmQ4_0>(w, y, xq, xds, n_tok, s); break;
        case GGMLType::Q4_1: launch_tokens<GemmQ4_1>(w, y, xq, xds, n_tok, s); break;
        case GGMLType::Q5_0: launch_tokens<GemmQ5<false>>(w, y, xq, xds, n_tok, s); break;
        case GGMLType::Q5_1: launch_tokens<GemmQ5<true>>(w, y, xq, xds, n_tok, s); break;
        case GGMLType::Q8_0: launch_tokens<GemmQ8_0>(w, y, xq, xds, n_tok, s); break;
        case GGMLType::MXFP4: launch_tokens<GemmTable4<true>>(w, y, xq, xds, n_tok, s); break;
        case GGMLType::IQ4_NL: launch_tokens<GemmTable4<false>>(w, y, xq, xds, n_tok, s); break;
        default: fail("cuda gemm_q8: unsupported weight type ", block_info(w.type).name);
    }
}

} // namespace cuda
} // namespace ember
