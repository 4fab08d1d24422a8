// Paged attention over f16 K/V blocks, causal (within a sliding window where the layer has one),
// for decode and prompt batches alike.
// A CTA takes one tile of <= 8 consecutive tokens of one sequence, the q heads of one KV head
// it can hold (GQA: K/V loaded once for all of them), and one of n_split key ranges
// (flash-decoding: long contexts are split so a single token still fills the GPU). Keys are
// streamed once with an online softmax; no score matrix is kept. Per key a group of TPK
// lanes holds 8 dims each (16-byte loads of K and V). Splits > 1 write unnormalized partials
// that the last CTA to finish merges. Q and the probabilities are rounded to f16 as in
// llama.cpp's attention, so greedy decoding follows the reference closely.
// Heads wider than kMaxNarrowHeadDim (Gemma 4's global layers, 512) take a wide form: 16 dims of a
// key a lane (a whole warp a key), at most kMaxWidePairsPerCta queries a CTA, whose warps' partial
// outputs then still fit the 48 KB of static shared memory (kernel_choice.h).
#include <algorithm>

#include "async_copy.cuh"
#include "attention_splits.cuh"
#include "common.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kAttnWarps = 4;

// Merge softmax state (mo, lo, ao) into (m, l, a) of C chunks of 8 dims, chunk j of ao at ao + stride
// j; either may be empty (m = -inf).
template <int C>
__device__ __forceinline__ void merge_state(float& m, float& l, float* a, float mo, float lo, const float* ao,
                                            int stride) {
    const float mn = fmaxf(m, mo);
    if (mn == -INFINITY) return;
    const float ca = exp2f(m - mn), cb = exp2f(mo - mn);
    l = l * ca + lo * cb;
#pragma unroll
    for (int j = 0; j < C; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) a[8 * j + e] = a[8 * j + e] * ca + ao[stride * j + e] * cb;
    m = mn;
}

// M query slots (q head x token) a CTA; C chunks of 8 dims of a key a lane: lane c of a key's group
// of tpk lanes holds dims 8 (c + tpk j) .. + 7 for j < C, so head dims up to kWarp * 8 * C.
template <int M, int C>
__global__ void __launch_bounds__(kAttnWarps * kWarp) attention_kernel(AttentionArgs a, DeviceBatch b) {
    static_assert(C == 1 || C == 2, "the narrow form (C = 1) and the wide one (C = 2)");
    constexpr int kHeadDim = kWarp * 8 * C;   // the most this form takes
    pdl_wait();
    pdl_trigger();
    const AttnTile tile = a.tiles[blockIdx.x];
    const int n_rep = a.n_head / a.n_head_kv;
    const int HC = a.heads_per_cta;
    const int n_hchunks = (n_rep + HC - 1) / HC;
    const int kvh = blockIdx.y / n_hchunks, hc = blockIdx.y % n_hchunks;
    const int split = blockIdx.z;
    const int hd = a.head_dim, kv_dim = a.n_head_kv * hd, q_dim = a.n_head * hd;
    const int nd8 = hd / 8, lanes = (nd8 + C - 1) / C;
    int tpk = 1;
    while (tpk < lanes) tpk <<= 1;
    const int kpw = kWarp / tpk;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c = lane & (tpk - 1), grp = lane / tpk;
    // The lane's chunk j holds dims of the head. Read as dim_ok[C == 1 ? 0 : j]: a loop variable's
    // index, even one that is always 0, changes the narrow form's code.
    bool dim_ok[C];
#pragma unroll
    for (int j = 0; j < C; ++j) dim_ok[j] = c + tpk * j < nd8;

    int tok[M], head[M], lim[M], low[M];
    int maxlen = 0, minlow = 0x7fffffff;   // (slot 0 always holds a query)
#pragma unroll
    for (int i = 0; i < M; ++i) {
        const int ti = i / HC, hi = i % HC;
        const bool ok = i < HC * a.tile_len && ti < tile.count && hc * HC + hi < n_rep;
        tok[i] = tile.first + (ok ? ti : 0);
        head[i] = kvh * n_rep + hc * HC + hi;
        lim[i] = ok ? b.pos[tok[i]] : -1;   // keys low..lim attend
        low[i] = attention_first_key(a, lim[i]);
        maxlen = max(maxlen, lim[i] + 1);
        if (ok) minlow = min(minlow, low[i]);
    }
    const int seq = b.seq[tile.first];
    // The splits share the keys some query of the tile sees: [minlow, maxlen).
    const int chunk = (maxlen - minlow + a.n_split - 1) / a.n_split;
    const int k0 = minlow + split * chunk, k1 = min(maxlen, k0 + chunk);

    float q[M][8 * C], acc[M][8 * C], m[M], l[M];
    const float qscale = a.scale * kLog2e;   // scores in the log2 domain: exp2 below
#pragma unroll
    for (int i = 0; i < M; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int j = 0; j < 8 * C; ++j) {
            acc[i][j] = 0.f;
            // q rounded to f16 first, as llama.cpp's f16 K.Q dot does: keeps greedy decoding in step.
            q[i][j] = (lim[i] >= 0 && dim_ok[C == 1 ? 0 : j / 8])
                          ? __half2float(__float2half_rn(a.q[int64_t(tok[i]) * q_dim + head[i] * hd + 8 * c +
                                                             (C == 1 ? j : 8 * tpk * (j / 8) + j % 8)])) *
                                qscale
                          : 0.f;
        }
    }

    const int32_t* bt = b.block_table + int64_t(seq) * b.max_blocks;
    const int bs = a.block_size;
    // kUnroll keys per lane group per iteration, all loads issued before any is used (more for
    // decode, whose few queries leave registers to spare: long contexts are latency bound). The
    // wide form's lanes load C chunks a key, so the same bytes are in flight with fewer keys.
    constexpr int kUnroll = (M <= 2 ? 4 : 2) / C;
    const int step = kAttnWarps * kpw;
    for (int kb = k0 + warp * kpw; kb < k1; kb += kUnroll * step) {
        uint4 kr[kUnroll][C], vr[kUnroll][C];
        int kk[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            kk[u] = kb + u * step + grp;
#pragma unroll
            for (int j = 0; j < C; ++j) {
                kr[u][j] = vr[u][j] = make_uint4(0, 0, 0, 0);
                if (kk[u] < k1 && dim_ok[C == 1 ? 0 : j]) {
                    const int64_t off = (int64_t(bt[kk[u] / bs]) * bs + kk[u] % bs) * kv_dim + kvh * hd +
                                        8 * (c + tpk * j);
                    kr[u][j] = *reinterpret_cast<const uint4*>(a.k_cache + off);
                    vr[u][j] = *reinterpret_cast<const uint4*>(a.v_cache + off);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int k = kk[u];
            float kf[8 * C], vf[8 * C];
#pragma unroll
            for (int j = 0; j < C; ++j) {
                unpack8(kr[u][j], kf + 8 * j);
                unpack8(vr[u][j], vf + 8 * j);
            }
            float s[M];
#pragma unroll
            for (int i = 0; i < M; ++i) {
                float d = 0.f;
#pragma unroll
                for (int j = 0; j < 8 * C; ++j) d += q[i][j] * kf[j];
                s[i] = d;
            }
            for (int o = tpk >> 1; o > 0; o >>= 1) {
#pragma unroll
                for (int i = 0; i < M; ++i) s[i] += __shfl_xor_sync(0xffffffffu, s[i], o);
            }
#pragma unroll
            for (int i = 0; i < M; ++i) s[i] = softcap_log2(a, s[i]);
#pragma unroll
            for (int i = 0; i < M; ++i) {
                if (k < k1 && k <= lim[i] && k >= low[i]) {
                    const float mn = fmaxf(m[i], s[i]);
                    const float corr = exp2f(m[i] - mn), p = exp2f(s[i] - mn);
                    const float ph = __half2float(__float2half_rn(p));   // f16 probabilities times f16 V
                    l[i] = l[i] * corr + p;
#pragma unroll
                    for (int j = 0; j < 8 * C; ++j) acc[i][j] = acc[i][j] * corr + ph * vf[j];
                    m[i] = mn;
                }
            }
        }
    }

    // Merge the key groups of this warp (lanes c, c + tpk, ...), then the warps.
    for (int o = tpk; o < kWarp; o <<= 1) {
#pragma unroll
        for (int i = 0; i < M; ++i) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[i], o), lo = __shfl_xor_sync(0xffffffffu, l[i], o);
            float ao[8 * C];
#pragma unroll
            for (int j = 0; j < 8 * C; ++j) ao[j] = __shfl_xor_sync(0xffffffffu, acc[i][j], o);
            merge_state<C>(m[i], l[i], acc[i], mo, lo, ao, 8);
        }
    }
    // kAttnWarps * M * kHeadDim floats: 32 KB for the narrow form's M = 8 and the wide form's M = 4.
    __shared__ float sm_acc[kAttnWarps][M][kHeadDim];
    __shared__ float sm_m[kAttnWarps][M], sm_l[kAttnWarps][M];
    if (grp == 0) {
#pragma unroll
        for (int i = 0; i < M; ++i) {
#pragma unroll
            for (int j = 0; j < C; ++j)
                if (dim_ok[C == 1 ? 0 : j])
#pragma unroll
                    for (int e = 0; e < 8; ++e) sm_acc[warp][i][8 * (c + tpk * j) + e] = acc[i][8 * j + e];
            if (c == 0) {
                sm_m[warp][i] = m[i];
                sm_l[warp][i] = l[i];
            }
        }
    }
    __syncthreads();
    if (warp == 0 && grp == 0 && dim_ok[0]) {   // (a lane whose chunk 0 is past the head has no later one)
#pragma unroll
        for (int i = 0; i < M; ++i) {
            if (lim[i] < 0) continue;
            for (int w = 1; w < kAttnWarps; ++w)
                merge_state<C>(m[i], l[i], acc[i], sm_m[w][i], sm_l[w][i], &sm_acc[w][i][8 * c], 8 * tpk);
            if (a.n_split == 1) {
                const float sum = l[i] + sink_term(a, head[i], m[i]);
                const float inv = sum > 0.f ? 1.f / sum : 0.f;
                float* o = a.out + int64_t(tok[i]) * q_dim + head[i] * hd + 8 * c;
#pragma unroll
                for (int j = 0; j < C; ++j)
                    if (j == 0 || dim_ok[j])
#pragma unroll
                        for (int e = 0; e < 8; ++e) o[8 * tpk * j + e] = acc[i][8 * j + e] * inv;
            } else {
                const int64_t slot = (int64_t(split) * a.n_tok + tok[i]) * a.n_head + head[i];
                float* o = a.part_acc + slot * hd + 8 * c;
#pragma unroll
                for (int j = 0; j < C; ++j)
                    if (j == 0 || dim_ok[j])
#pragma unroll
                        for (int e = 0; e < 8; ++e) o[8 * tpk * j + e] = acc[i][8 * j + e];
                if (c == 0) a.part_ml[slot] = make_float2(m[i], l[i]);
            }
        }
    }
    if (a.n_split == 1 || !last_of_splits(a)) return;
    for (int e = threadIdx.x; e < M * hd; e += blockDim.x) {
        const int i = e / hd, d = e % hd, ti = i / HC, hi = i % HC;
        if (!(i < HC * a.tile_len && ti < tile.count && hc * HC + hi < n_rep)) continue;
        const int64_t th = int64_t(tile.first + ti) * a.n_head + kvh * n_rep + hc * HC + hi;
        a.out[th * hd + d] = merge_splits(a, th, d);
    }
}

// Decode over a long q8_0 cache (flash-decoding; the f16 cache has its tensor-core kernel in
// attention_decode_mma.cu): one CTA per (token, kv head's group of up to kDecMaxHeads q heads,
// key range). K and V stream through shared memory in tiles of kDecTile keys, kDecStages deep, so
// loads never wait on the math; each tile gets its own softmax update. Scores: 8 lanes per key,
// each over hd/8 dims, q quantized per 32 dims so they are int8 dot products; values: one thread
// per output dim.
constexpr int kDecThreads = 128;
constexpr int kDecTile = 32;
constexpr int kDecStages = 3;
constexpr int kDecMaxHeads = kDecodeQ8Heads;   // one warp per head for the softmax step

// Shared-memory tile geometry of one pipeline stage (K and V of kDecTile keys, src/backend/kv_layout.h):
// [K, V][kDecTile][hd] int8 then [K, V][kDecTile][hd / 32] f16 scales. The int8 rows are
// swizzled: byte b of key k sits at b ^ swizzle(k), so the four keys a warp reads at once fall on
// different banks.
template <int HD>
struct DecTile {
    static constexpr int kRow = HD;   // bytes per key row
    __device__ static int swizzle(int key) { return (key & (HD / 64 - 1)) * 64; }
    static constexpr int kData = 2 * kDecTile * kRow;
    static constexpr int kScales = 2 * kDecTile * HD / 16;   // bytes
    static constexpr int kBytes = kData + kScales;
};

// An int8 (as its byte u) to float without the quarter-rate I2F: 2^23 + (int8 + 128) built from
// the bits, minus 2^23 + 128 (exact).
__device__ __forceinline__ float i8_to_float(uint32_t u) { return __int_as_float(0x4B000000 | (u ^ 0x80)) - 8388736.f; }

// M q heads per CTA, NC chunks of 8 dims of a key per lane (hd = 64 * NC); kWindow: the layer has
// a sliding window or chunks (the window's masks are compiled out of the other instantiation, whose copy
// loop issues at the rate the long-context q8_0 decode depends on).
template <int M, int NC, bool kWindow>
__global__ void __launch_bounds__(kDecThreads) attention_decode_kernel(AttentionArgs a, DeviceBatch b) {
    constexpr int hd = 64 * NC;
    using Tile = DecTile<hd>;
    extern __shared__ uint4 tiles[];   // [kDecStages][Tile::kBytes]
    __shared__ float ps[M][kDecTile];
    __shared__ __align__(16) float pv[M][hd / 32][kDecTile];   // probability x V scale
    __shared__ float corr_s[M], m_s[M], l_s[M];
    pdl_wait();
    pdl_trigger();
    const DecodeCta c = decode_cta(a, b, M, kDecTile);
    const int t = c.t, split = c.split, kvh = c.kvh, h0 = c.h0, n_heads_here = c.n_rows, lo = c.lo, k0 = c.k0,
              k1 = c.k1;
    const int n_tiles = c.n_tiles;
    const int kv_dim = a.n_head_kv * hd, q_dim = a.n_head * hd;
    const int32_t* bt = b.block_table + int64_t(b.seq[t]) * b.max_blocks;
    const int bs = a.block_size;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t block_bytes = int64_t(bs) * kv_dim + int64_t(bs) * kv_dim / 16;   // q8_0 layout

    auto stage = [&](int j) { return reinterpret_cast<uint8_t*>(tiles) + (j % kDecStages) * Tile::kBytes; };
    // Copies of one tile: every divisor is a compile-time power of two (the block size too:
    // the backend sends only power-of-two blocks here), so address math stays a few shifts.
    const int bs_shift = __ffs(bs) - 1;
    auto key_row = [&](int key) { return int64_t(bt[key >> bs_shift]) * bs + (key & (bs - 1)); };
    auto issue = [&](int j) {
        if (j < n_tiles) {
            uint8_t* dst = stage(j);
            const int key0 = k0 + j * kDecTile;
            {
                // int8 rows: hd / 16 chunks a key; scales: hd / 16 bytes a key, so a 16-byte chunk
                // holds kSk consecutive keys of one block (head-major layout, kv_layout.h).
                constexpr int n16 = hd / 16, kChunks = kDecTile * n16, kSk = 256 / hd, kScaleChunks = kDecTile / kSk;
                for (int e = tid; e < 2 * (kChunks + kScaleChunks); e += kDecThreads) {
                    const bool scale = e >= 2 * kChunks;
                    const int ee = scale ? e - 2 * kChunks : e;
                    const int kv = scale ? ee / kScaleChunks : ee / kChunks,
                              r = scale ? ee % kScaleChunks : ee % kChunks;
                    // Keys outside [lo, k1) are zero-filled from a visible key's address (a key
                    // below the window may lie in a block the cache no longer holds); a scale chunk
                    // is copied when any of its keys is visible.
                    const int key = key0 + (scale ? r * kSk : r / n16);
                    const bool ok = key < k1 && (!kWindow || (scale ? key + kSk > lo : key >= lo));
                    const int64_t kr = key_row(ok ? key : (kWindow ? max(k0, lo) : k0));   // block * bs + slot
                    const uint8_t* base = reinterpret_cast<const uint8_t*>(kv ? a.v_cache : a.k_cache) +
                                          (kr >> bs_shift) * block_bytes;
                    const int64_t row = (int64_t(kvh) * bs + (kr & (bs - 1))) * hd;
                    if (!scale)
                        cp_async16_zfill(dst + kv * kDecTile * Tile::kRow + (r / n16) * Tile::kRow +
                                             ((16 * (r % n16)) ^ Tile::swizzle(r / n16)),
                                         base + row + 16 * (r % n16), ok);
                    else
                        cp_async16_zfill(dst + Tile::kData + kv * kDecTile * (hd / 16) + 16 * r,
                                         base + int64_t(bs) * kv_dim + row / 16, ok);
                }
            }
        }
        cp_async_commit();
    };
    for (int j = 0; j < kDecStages - 1; ++j) issue(j);

    // Lane part p (of 8) of a key owns dims 8 (p + 8 c) .. + 7: q for those dims, quantized per
    // 32 dims (lanes p..p+3 share a group), so scores are int8 dot products.
    const int part = tid & 7, key_in_pass = tid >> 3;   // 16 keys per pass, two passes per tile
    const float qscale = a.scale * kLog2e;
    float q[M][NC];     // the group's scale d times qscale
    int qi[M][NC][2];   // the 8 int8 values, packed
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            float x[8];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                x[j] = i < n_heads_here ? a.q[int64_t(t) * q_dim + (h0 + i) * hd + 8 * (part + 8 * c) + j] : 0.f;
            float amax = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j]));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
            const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
            uint32_t w[2] = {0u, 0u};
#pragma unroll
            for (int j = 0; j < 8; ++j) w[j / 4] |= (uint32_t(__float2int_rn(x[j] * id)) & 0xFFu) << (8 * (j % 4));
            qi[i][c][0] = int(w[0]);
            qi[i][c][1] = int(w[1]);
            q[i][c] = d * qscale;
        }
    if (tid < M) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.f;
    }
    __syncthreads();
    float acc[M][NC];   // output dims tid + kDecThreads * c (those below hd)
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[i][c] = 0.f;

    for (int j = 0; j < n_tiles; ++j) {
        issue(j + kDecStages - 1);
        cp_async_wait<kDecStages - 1>();
        __syncthreads();
        const uint8_t* st = stage(j);
#pragma unroll
        for (int pass = 0; pass < kDecTile / 16; ++pass) {
            const int key = pass * 16 + key_in_pass;
            float s[M];
#pragma unroll
            for (int i = 0; i < M; ++i) s[i] = 0.f;
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const int d0 = 8 * (part + 8 * c);
                const float dk = __half2float(
                    reinterpret_cast<const __half*>(st + Tile::kData)[key * (hd / 32) + d0 / 32]);
                const uint2 kw = *reinterpret_cast<const uint2*>(st + key * Tile::kRow + (d0 ^ Tile::swizzle(key)));
#pragma unroll
                for (int i = 0; i < M; ++i)
                    s[i] += float(__dp4a(int(kw.y), qi[i][c][1], __dp4a(int(kw.x), qi[i][c][0], 0))) * (dk * q[i][c]);
            }
            const int k = k0 + j * kDecTile + key;
            const bool visible = k < k1 && (!kWindow || k >= lo);
#pragma unroll
            for (int i = 0; i < M; ++i) {
                s[i] += __shfl_xor_sync(0xffffffffu, s[i], 1);
                s[i] += __shfl_xor_sync(0xffffffffu, s[i], 2);
                s[i] += __shfl_xor_sync(0xffffffffu, s[i], 4);
                if (part == 0) ps[i][key] = visible ? softcap_log2(a, s[i]) : -INFINITY;
            }
        }
        __syncthreads();
        if (warp < M) {   // softmax step of head `warp`: lane = key of the tile
            const float sc = ps[warp][lane], m_old = m_s[warp];
            const float m_new = fmaxf(m_old, warp_max(sc));
            const float p = sc == -INFINITY ? 0.f : exp2f(sc - m_new);
            const float corr = m_old == -INFINITY ? 0.f : exp2f(m_old - m_new);
            const float sum = warp_sum(p);
            const __half* vsc = reinterpret_cast<const __half*>(st + Tile::kData) + kDecTile * (hd / 32) +
                                lane * (hd / 32);
#pragma unroll   // (a masked key's scale may be any bits: keep its product 0)
            for (int g = 0; g < hd / 32; ++g) pv[warp][g][lane] = sc == -INFINITY ? 0.f : p * __half2float(vsc[g]);
            if (lane == 0) {
                corr_s[warp] = corr;
                m_s[warp] = m_new;
                l_s[warp] = l_s[warp] * corr + sum;
            }
        }
        __syncthreads();
        const uint8_t* vt = st + kDecTile * Tile::kRow;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int d = tid + kDecThreads * c;
            if (d >= hd) break;
#pragma unroll
            for (int i = 0; i < M; ++i) {
                float o = acc[i][c] * corr_s[i], o1 = 0.f;   // two chains of FMAs; four keys' weights in one load
                const float4* w4 = reinterpret_cast<const float4*>(pv[i][d / 32]);
#pragma unroll
                for (int key = 0; key < kDecTile; key += 4) {
                    const float4 w = w4[key / 4];
                    const uint8_t* v4 = vt + key * Tile::kRow;
                    o += w.x * i8_to_float(v4[d ^ Tile::swizzle(key)]);
                    o1 += w.y * i8_to_float(v4[Tile::kRow + (d ^ Tile::swizzle(key + 1))]);
                    o += w.z * i8_to_float(v4[2 * Tile::kRow + (d ^ Tile::swizzle(key + 2))]);
                    o1 += w.w * i8_to_float(v4[3 * Tile::kRow + (d ^ Tile::swizzle(key + 3))]);
                }
                acc[i][c] = o + o1;
            }
        }
        __syncthreads();   // the stage is refilled next iteration
    }

    for (int i = 0; i < n_heads_here; ++i) {
        const int64_t th = int64_t(t) * a.n_head + h0 + i;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int d = tid + kDecThreads * c;
            if (d >= hd) break;
            if (a.n_split == 1) {
                const float sum = l_s[i] + sink_term(a, h0 + i, m_s[i]);
                store_out(a, th * hd + d, sum > 0.f ? acc[i][c] / sum : 0.f);
            } else {
                const int64_t slot = int64_t(split) * a.n_tok * a.n_head + th;
                a.part_acc[slot * hd + d] = acc[i][c];
                if (d == 0) a.part_ml[slot] = make_float2(m_s[i], l_s[i]);
            }
        }
    }
    if (a.n_split == 1 || !last_of_splits(a)) return;
    for (int e = tid; e < n_heads_here * hd; e += kDecThreads) {
        const int64_t th = int64_t(t) * a.n_head + h0 + e / hd;
        store_out(a, th * hd + e % hd, merge_splits(a, th, e % hd));
    }
}

template <int M, int NC, bool kWindow>
void launch_decode_kernel(const AttentionArgs& a, const DeviceBatch& b, dim3 grid, cudaStream_t s) {
    const size_t smem = size_t(kDecStages) * DecTile<64 * NC>::kBytes;
    static bool opted_in = false;   // above 48 KB of dynamic shared memory needs the opt-in
    if (!opted_in) {
        EMBER_CUDA_CHECK(cudaFuncSetAttribute(attention_decode_kernel<M, NC, kWindow>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        opted_in = true;
    }
    launch_pdl_smem(attention_decode_kernel<M, NC, kWindow>, grid, dim3(kDecThreads), smem, s, a, b);
}

template <int M, int NC>
void launch_decode(const AttentionArgs& a, const DeviceBatch& b, dim3 grid, cudaStream_t s) {
    if (a.window > 0 || a.chunk > 0) launch_decode_kernel<M, NC, true>(a, b, grid, s);
    else launch_decode_kernel<M, NC, false>(a, b, grid, s);
}

template <int M>
void launch_decode_hd(const AttentionArgs& a, const DeviceBatch& b, dim3 grid, cudaStream_t s) {
    switch (a.head_dim) {
        case 64: launch_decode<M, 1>(a, b, grid, s); break;
        case 128: launch_decode<M, 2>(a, b, grid, s); break;
        default: launch_decode<M, 4>(a, b, grid, s); break;   // 256
    }
}

}  // namespace

void attention(const AttentionArgs& a, const DeviceBatch& b, cudaStream_t s) {
    if (a.head_dim % 8 || a.head_dim > kMaxAttnHeadDim)
        fail("cuda attention: head_dim ", a.head_dim, " must be a multiple of 8 and at most ", kMaxAttnHeadDim);
    if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv)
        fail("cuda attention: n_head ", a.n_head, " is not a multiple of n_head_kv ", a.n_head_kv);
    if (a.n_tiles == 0) return;
    const int n_rep = a.n_head / a.n_head_kv;
    const int pairs = a.heads_per_cta * a.tile_len;
    const int n_hchunks = (n_rep + a.heads_per_cta - 1) / a.heads_per_cta;
    const dim3 grid(unsigned(a.n_tiles), unsigned(a.n_head_kv * n_hchunks), unsigned(a.n_split));
    const dim3 block(kAttnWarps * kWarp);
    static_assert(kMaxNarrowHeadDim == kWarp * 8 && kMaxAttnHeadDim == 2 * kWarp * 8, "the forms' lane layouts");
    if (a.head_dim > kMaxNarrowHeadDim) {
        if (pairs <= 1) launch_pdl(attention_kernel<1, 2>, grid, block, s, a, b);
        else if (pairs <= 2) launch_pdl(attention_kernel<2, 2>, grid, block, s, a, b);
        else if (pairs <= kMaxWidePairsPerCta)
            launch_pdl(attention_kernel<kMaxWidePairsPerCta, 2>, grid, block, s, a, b);
        else
            fail("cuda attention: ", pairs, " query heads per CTA exceeds ", kMaxWidePairsPerCta, " for head_dim ",
                 a.head_dim);
    } else if (pairs <= 1) launch_pdl(attention_kernel<1, 1>, grid, block, s, a, b);
    else if (pairs <= 2) launch_pdl(attention_kernel<2, 1>, grid, block, s, a, b);
    else if (pairs <= 4) launch_pdl(attention_kernel<4, 1>, grid, block, s, a, b);
    else if (pairs <= 8) launch_pdl(attention_kernel<8, 1>, grid, block, s, a, b);
    else fail("cuda attention: ", pairs, " query heads per CTA exceeds 8");
    EMBER_CUDA_LAUNCHED("attention");
}

void attention_decode(const AttentionArgs& a, const DeviceBatch& b, cudaStream_t s) {
    if (!a.kv_q8) fail("cuda attention_decode: reads a q8_0 cache (attention_decode_mma takes f16)");
    const int M = attention_decode_heads(a.n_head, a.n_head_kv, a.head_dim, true);
    if (M == 0) fail("cuda attention_decode: head_dim ", a.head_dim, " is not 64, 128 or 256");
    if (a.n_tok == 0) return;
    const int n_hchunks = (a.n_head / a.n_head_kv + M - 1) / M;
    const dim3 grid(unsigned(a.n_tok), unsigned(a.n_head_kv * n_hchunks), unsigned(a.n_split));
    switch (M) {
        case 1: launch_decode_hd<1>(a, b, grid, s); break;
        case 2: launch_decode_hd<2>(a, b, grid, s); break;
        case 3: launch_decode_hd<3>(a, b, grid, s); break;
        default: launch_decode_hd<4>(a, b, grid, s); break;
    }
    EMBER_CUDA_LAUNCHED("attention_decode");
}

}  // namespace cuda
}  // namespace ember
