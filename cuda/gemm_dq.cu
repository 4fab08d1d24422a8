// f16 tensor-core GEMM on weights dequantized in registers (Marlin-style), for continuous-batching
// decode steps of kMaxGemvTokens < n_tok <= kMaxGemmDqTokens: y [n_tok][n_out] = x W^T for Q4_0,
// Q4_1 and Q8_0 weights in the packed layout (weight_pack.h) against f16 activations
// (gemm_dq_input). Each weight element is turned into f16 once per CTA (magic-number conversion,
// the block scale applied with one HMUL2 / HFMA2) and multiplied on tensor cores (mma.sync
// m16n8k16, f32 accumulate) with every token of the tile, so the per-token cost is the mma alone.
//
// The K-quants (taken where EMBER_CUDA_GEMM_KQ=1 asks, kernel_choice.h; x tiles of at most 64
// tokens): a stage is one 256-element super-block of a row, and once a stage a thread a row turns its
// scales into f16 in shared memory (one more barrier a stage), which the warps read as Q4_1's {d, m}.
//   Q4_K (DqQ4_K), raw 144-byte blocks: the 128 quant bytes as the nibble formats' stage, the 16-byte
//     header as the stage's meta, converted to the 8 sub-blocks' {d * sc, -dmin * m}; 4.5 bits a
//     weight (Q4_0's 18 / 32 bytes too); per f16 pair a shift, a LOP3, an HSUB2 and an HFMA2 (Q4_1's
//     count); the conversion about 45 instructions a row, a tenth of the row's unpacking.
//   Q6_K (DqQ6_K), packed: ql as the stage's quants, qh as its meta, the 16 int8 scales and d loaded
//     into registers a stage ahead and converted to the 16 groups' d * sc; 6.56 bits a weight (210 /
//     256 bytes); per f16 pair two shifts, two LOPs, an HSUB2 and an HMUL2; its 84 KB stages of
//     64-token tiles fit only twice.
// Arithmetic at 32 tokens, per 256-row x 256-k stage: the weight read once, where the GEMV it
// replaces reads it once per chunk of 8 tokens (4 passes); 8 warps x 2 m16 tiles x 4 n8 tiles x 16
// k-steps = 1024 mma.sync, a Q4_0 stage's; a thread unpacks 4 rows x 64 weights.
//
// K order. An mma reads its 16 k positions in any order as long as A and B agree, so within each
// 32-block the k order is the one that unpacks cheapest: lane t (= lane % 4) of a fragment takes
// word t of the block's quants (elements 4t..4t+3 and, for the nibble formats, 4t+16..4t+19 in
// the high nibbles; Q8_0: word t + 4), fragment pairs (4t, 4t+2), (4t+1, 4t+3) for k-step 0 and
// the same 16 elements later for k-step 1. So k-step 0 reads elements 0, 2, ..., 14 as its k
// 0..7 and 1, 3, ..., 15 as its k 8..15, and gemm_dq_input writes x in that order (dq_order.cuh):
// a block's four 16-byte chunks are the evens and odds of its first 16 elements, then of the
// next 16. A chunk is then 8 consecutive k of one token, the row of a tensor-core B tile.
//
// CTA tile: kBM weight rows x BN = 8 * NJ tokens; each weight element is unpacked once per CTA
// and multiplied with every token of the tile. Two forms of the multiply:
//   mma.sync (any GPU): 8 warps along the rows, a warp 32 rows (two m16 tiles) x all BN (16, 32
//     or 64) tokens, B fragments from shared memory with ldmatrix; kBM = 256;
//   wgmma (Hopper, built for sm_90a): warpgroups of m64 tiles x BN (16..128) tokens, the A tiles
//     from the same per-warp registers and B read by the tensor cores from shared memory, so a
//     warp issues one instruction per 64 x BN x 16 product instead of BN / 8 (and B = 128 takes
//     one token tile: every weight unpacked once); two warpgroups of two tiles (kBM = 256) or
//     three of one (kBM = 192), per launch (Cta, launch_wgmma).
// Larger batches run several token tiles (grid y) over the same weight tile; the mma.sync form
// skips the n8 tiles past n_tok. K runs through a kStages-deep cp.async pipeline of 128 quant
// bytes a row per stage (kKB = 8 nibble blocks or 4 Q8_0 blocks). A stage:
//   weight quants [kBM][128]          16-byte chunk c of row r at c ^ (r & 7): the 8 rows of an
//                                     ldmatrix land in distinct banks
//   weight meta   [kBM][kKB * kMB]    the blocks' f16 d (and m)
//   x             [kKB / 2][BN][128]  panels of 64 k (two blocks, 8 chunks) a token, chunk c
//                                     of token n at c ^ (n & 7): wgmma's K-major B tile in its
//                                     128-byte swizzle; the 8 rows of an ldmatrix and the 8
//                                     chunks of a token's 128-byte copy land in distinct banks
// Rows need n_in % kDqAlign == 0: every stage is whole and every meta row 16-byte aligned.
// Within a step, the next step's quants and scales load while this one unpacks and multiplies, and
// the mmas go out k-step by k-step over all n8 tiles, so consecutive mmas are independent.
// Grid: x = K splits, y = token tiles, z = row tiles; one CTA an SM (the stages fill shared
// memory), the split count picked from the clusters that fit at once. The splits of a tile form a
// thread-block cluster that sums its partial tiles in rank order through distributed shared
// memory, as gemm_q8 does (deterministic, no workspace). Small weights are latency-bound: a CTA
// holds only a few stages, and its warps mostly wait for the first ones to land.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "async_copy.cuh"
#include "block_decode.cuh"
#include "common.cuh"
#include "kernels.h"
#include "launch.h"
#include "mma.cuh"
#include "wgmma.cuh"

namespace ember {
namespace cuda {

namespace {

constexpr int kRowBytes = 128;          // quant bytes of a row per stage
constexpr int kMaxSplit = 8;            // the portable cluster size
// Pipeline depth: three stages in flight keep HBM busy; a fourth only lengthens every CTA's fill,
// which the short K splits of decode-step matmuls pay in full.
constexpr int kMaxStages = 3;
constexpr int kCtaCostStages = 2;
constexpr int kSmemLimit = 227 * 1024;  // dynamic shared memory of one CTA (sm_90)
constexpr int kDqAlign = kGemmDqAlign;
constexpr int kMaxWeights = kMaxGemmDqWeights;

// The CTA shapes, by kWG: 0 is the mma.sync form (8 warps of 32 rows: two m16 tiles a warp), 2
// and 3 the wgmma form with that many warpgroups. Two warpgroups of two m64 tiles make 256-row
// tiles; three of one m64 tile make 192-row tiles, a third more tiles a weight, each stage a
// quarter fewer rows over twelve warps: an 11008-row weight's 58 tiles (116 for gate and up
// together) nearly fill 132 SMs where 43 (86) left a third of them idle. Which one a launch takes
// is the host's choice (pick_rows).
template <int kWG>
struct Cta {
    static constexpr bool kWg = kWG != 0;
    static constexpr int kWarps = kWg ? 4 * kWG : 8;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kMT = kWG == 3 ? 1 : 2;     // m16 row groups a warp
    static constexpr int kBM = 16 * kMT * kWarps;
    static constexpr int kCopyRows = kThreads / 8;   // rows of 8 16-byte chunks a copy slot covers
};

__device__ __forceinline__ __half2 as_h2(uint32_t u) {
    __half2 h;
    memcpy(&h, &u, 4);
    return h;
}
__device__ __forceinline__ uint32_t as_u32(__half2 h) {
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

// (a & kMask) | kOr in one LOP3 (written as C, the two immediates become two instructions).
template <uint32_t kMask, uint32_t kOr>
__device__ __forceinline__ uint32_t and_or(uint32_t a) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "n"(kMask), "n"(kOr));
    return r;
}

// The formats: their quants and metadata are laid out as their block decoders say (block_decode.cuh);
// the unpacking is this kernel's own, straight to f16 pairs in its K order (the decoders unpack to
// bytes, for integer dots: going through them would cost a conversion per element).
// StepMeta: the metadata of one ldmatrix step's blocks (two nibble blocks, one Q8_0
// block) of a row, one shared-memory load; scales(): block e's d (and m) of it, broadcast.
// dequant(): from a row's words (w0 = word t; Q8_0 also w1 = word t + 4) and the block's scales,
// the f16 A-fragment words of k-step 0 (k0) and k-step 1 (k1), each {pair (4t, 4t+2), pair (4t+1,
// 4t+3)} of its 16 elements. The quants become halves by OR-ing them into the mantissa of 1024
// (0x6400), exact; the offset goes before the scale, so each weight is d * q rounded once to f16,
// as dequantize_f16 rounds it.
// Where a format's stages lie in memory. The split formats (weight_pack.h): a row's quants are
// consecutive 128-byte stages of the quants region, its meta consecutive kMRow-byte stages of the
// meta region, copied to shared memory as they are (kConvRow 0: no conversion).
struct SplitFormat {
    static constexpr int kRawBlock = 0;   // bytes of a raw super-block (0: split regions)
    static constexpr int kQOff = 0;       // quants of a stage from its start
    static constexpr int kConvRow = 0;    // bytes of a row's converted meta (0: read as copied)
    static constexpr bool kPairedNibbles = false;
    static constexpr bool kQh = false;         // Q6_K: the meta copied is the quants' high bits
    static constexpr int kMOff = 0, kMPad = 0;   // meta of a stage from its start; pad of a row's copy
    static constexpr bool kConvGlobal = false;   // the conversion's input: copied meta, or registers
    // The 32-block of the stage whose x block e of step kl multiplies.
    __device__ static constexpr int x_block(int kl, int e) { return kl + e; }
};

struct DqQ4_0 : SplitFormat {
    static constexpr int kQB = DecodeQ4_0::kQuantBytes, kMB = int(sizeof(DecodeQ4_0::Meta));
    using StepMeta = uint32_t;   // f16 d of blocks kl, kl + 1
    __device__ static void scales(StepMeta m, int e, __half2& d, __half2&) {
        d = e ? __high2half2(as_h2(m)) : __low2half2(as_h2(m));
    }
    // Bits 0-3 and 16-19 of a word (shifted by 8 for the odd elements) are (4t, 4t+2), bits 4-7
    // and 20-23 the elements 16 later, read as 1024 + 16 q: times 1/16, minus 72 gives q - 8.
    __device__ static void dequant(uint32_t w, uint32_t, __half2 d, __half2, uint32_t (&k0)[2], uint32_t (&k1)[2]) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            const uint32_t v = w >> (8 * s);
            k0[s] = as_u32(__hmul2(__hsub2(as_h2(and_or<0x000F000Fu, 0x64006400u>(v)), as_h2(0x64086408u)), d));
            k1[s] = as_u32(__hmul2(
                __hfma2(as_h2(and_or<0x00F000F0u, 0x64006400u>(v)), as_h2(0x2C002C00u), as_h2(0xD480D480u)), d));
        }
    }
};

struct DqQ4_1 : SplitFormat {
    static constexpr int kQB = DecodeQ4_1::kQuantBytes, kMB = int(sizeof(DecodeQ4_1::Meta));
    using StepMeta = uint2;   // f16 d | f16 m << 16 of blocks kl, kl + 1
    __device__ static void scales(StepMeta m, int e, __half2& d, __half2& mn) {
        const __half2 dm = as_h2(e ? m.y : m.x);
        d = __low2half2(dm);
        mn = __high2half2(dm);
    }
    __device__ static void dequant(uint32_t w, uint32_t, __half2 d, __half2 m, uint32_t (&k0)[2], uint32_t (&k1)[2]) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            const uint32_t v = w >> (8 * s);
            k0[s] = as_u32(__hfma2(__hsub2(as_h2(and_or<0x000F000Fu, 0x64006400u>(v)), as_h2(0x64006400u)), d, m));
            k1[s] = as_u32(__hfma2(
                __hfma2(as_h2(and_or<0x00F000F0u, 0x64006400u>(v)), as_h2(0x2C002C00u), as_h2(0xD400D400u)), d, m));
        }
    }
};

// Q8_0: the sign bit flipped (q + 128) and the bytes permuted under 0x64: 1024 + 128 + q.
struct DqQ8_0 : SplitFormat {
    static constexpr int kQB = DecodeQ8_0::kQuantBytes, kMB = int(sizeof(DecodeQ8_0::Meta));
    using StepMeta = __half;   // d of block kl
    __device__ static void scales(StepMeta m, int, __half2& d, __half2&) { d = __half2half2(m); }
    __device__ static void dequant(uint32_t w0, uint32_t w1, __half2 d, __half2, uint32_t (&k0)[2], uint32_t (&k1)[2]) {
        const __half2 bias = as_h2(0x64806480u);
        const uint32_t u0 = w0 ^ 0x80808080u, u1 = w1 ^ 0x80808080u;
        k0[0] = as_u32(__hmul2(__hsub2(as_h2(__byte_perm(u0, 0x64646464u, 0x4240)), bias), d));
        k0[1] = as_u32(__hmul2(__hsub2(as_h2(__byte_perm(u0, 0x64646464u, 0x4341)), bias), d));
        k1[0] = as_u32(__hmul2(__hsub2(as_h2(__byte_perm(u1, 0x64646464u, 0x4240)), bias), d));
        k1[1] = as_u32(__hmul2(__hsub2(as_h2(__byte_perm(u1, 0x64646464u, 0x4341)), bias), d));
    }
};

// Q4_K, in its raw 144-byte super-blocks (DecodeQK): a stage is one super-block of a row, its 16-byte
// header (the meta, copied as it is) and its 128 quant bytes from byte 16. Quant chunk c (bytes
// 32c..32c+31) holds sub-block 2c in its low nibbles and 2c + 1 in its high ones, element l of each
// in byte l: so a step's two 16-byte chunks are the two halves of sub-blocks kl and kl + 1, and
// block e of the step (sub-block kl + e) takes word t of both chunks, low nibbles for e = 0, high
// for e = 1: elements 4t..4t+3 from chunk 0 (k-step 0) and 4t+16..4t+19 from chunk 1 (k-step 1),
// the order the split nibble formats give their one chunk's low and high nibbles, so x and the
// B fragments are read exactly as for them. Each weight is q * D - M with D = d * sc and M = dmin * m
// of its sub-block rounded to f16 (convert, once a stage and row), the product and the difference
// rounded once (HFMA2).
struct DqQ4_K {
    static constexpr int kRawBlock = 144;
    static constexpr int kQOff = 16;
    static constexpr int kQB = 16, kMB = 2;   // a 32-element sub-block's quant bytes; kKB * kMB = the header
    // Converted meta of a row: 8 words {f16 D, f16 -M} of the sub-blocks, then 8 bytes of pad: rows
    // g = 0..7 of a fragment at a 40-byte stride read 8-byte pairs from distinct banks.
    static constexpr int kConvRow = 40;
    static constexpr bool kPairedNibbles = true, kQh = false, kConvGlobal = false;
    static constexpr int kMOff = 0, kMPad = 0;
    __device__ static constexpr int x_block(int kl, int e) { return kl + e; }
    using StepMeta = uint2;   // {D, -M} of sub-blocks kl, kl + 1
    __device__ static void scales(StepMeta m, int e, __half2& d, __half2& mn) {
        const __half2 dm = as_h2(e ? m.y : m.x);
        d = __low2half2(dm);
        mn = __high2half2(dm);
    }
    // Four 6-bit values in bytes (0..63) as f16 pairs {v0, v1}, {v2, v3}: 1024 + v, minus 1024 (exact).
    __device__ static void bytes_to_h2(uint32_t v, __half2& lo, __half2& hi) {
        lo = __hsub2(as_h2(__byte_perm(v, 0x64646464u, 0x5140)), as_h2(0x64006400u));
        hi = __hsub2(as_h2(__byte_perm(v, 0x64646464u, 0x5342)), as_h2(0x64006400u));
    }
    // The header (f16 d | f16 dmin << 16, then the 12 bytes of 6-bit scales and mins) of one row's
    // super-block -> 8 words {f16 d * sc, f16 -(dmin * m)}, one a sub-block. Sub-blocks 0..3: the low 6
    // bits of bytes 0..3 (sc) and 4..7 (m); 4..7: the nibbles of bytes 8..11 (sc low, m high), their
    // top two bits from the top two bits of bytes 0..3 (sc) and 4..7 (m).
    __device__ static void convert(const uint8_t* hdr, uint8_t* out) {
        const uint4 h = *reinterpret_cast<const uint4*>(hdr);
        const __half2 d = __low2half2(as_h2(h.x)), nmin = __hneg2(__high2half2(as_h2(h.x)));
        const uint32_t sc[2] = {h.y & 0x3F3F3F3Fu, (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u)};
        const uint32_t mn[2] = {h.z & 0x3F3F3F3Fu, ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u)};
        uint2* o = reinterpret_cast<uint2*>(out);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            __half2 s01, s23, m01, m23;
            bytes_to_h2(sc[half], s01, s23);
            bytes_to_h2(mn[half], m01, m23);
            s01 = __hmul2(s01, d);
            s23 = __hmul2(s23, d);
            m01 = __hmul2(m01, nmin);
            m23 = __hmul2(m23, nmin);
            o[2 * half] = make_uint2(as_u32(__lows2half2(s01, m01)), as_u32(__highs2half2(s01, m01)));
            o[2 * half + 1] = make_uint2(as_u32(__lows2half2(s23, m23)), as_u32(__highs2half2(s23, m23)));
        }
    }
    // w0, w1: word t of the step's chunks 0 and 1; e: the step's sub-block (0: low nibbles, 1: high).
    __device__ static void dequant(uint32_t w0, uint32_t w1, int e, __half2 d, __half2 nm, uint32_t (&k0)[2],
                                   uint32_t (&k1)[2]) {
        const __half2 magic = as_h2(0x64006400u);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            const int sh = 8 * s + 4 * e;
            k0[s] = as_u32(__hfma2(__hsub2(as_h2(and_or<0x000F000Fu, 0x64006400u>(w0 >> sh)), magic), d, nm));
            k1[s] = as_u32(__hfma2(__hsub2(as_h2(and_or<0x000F000Fu, 0x64006400u>(w1 >> sh)), magic), d, nm));
        }
    }
};

// Q6_K in its packed layout (weight_pack.h): a super-block's 192 quant bytes (ql[128], then qh[64]),
// its 16 int8 scales in the meta region and its f16 d in the meta2 region. A stage is one
// super-block of a row: ql as the nibble formats' 128-byte stage, qh as the stage's meta (copied
// from the quants region, rows padded to 80 bytes: the 8 rows of a fragment read distinct banks),
// and the scales and d, which the thread of each row loads into registers a stage ahead and turns
// into the 16 f16 D = d * sc (its 16-element groups), a row's words in step order, in the stage's
// conversion. ggml's order: element 32j + l (j = 0..3, l = 0..31) of each 128-element half n is ql
// byte 64n + 32 (j & 1) + l, nibble j >> 1, with bits 2j, 2j + 1 of qh byte 32n + l on top, minus 32,
// times D of group 2 (4n + j) + l / 16. So ql chunks kl, kl + 1 of step kl = 4n + 2p hold sub-blocks
// 4n + p (low nibbles, e = 0) and 4n + p + 2 (high, e = 1), k-step 0 and 1 their l < 16 and l >= 16
// as for Q4_K; x block x_block(kl, e) multiplies them; lane t's high bits are qh words 8n + t and
// 8n + 4 + t. Each weight is (q - 32) * D rounded once (HMUL2); the two k-steps take their groups' D.
struct DqQ6_K {
    static constexpr int kRawBlock = 192;   // the quants region's bytes a super-block
    static constexpr int kQOff = 0;
    static constexpr int kQB = 16, kMB = 8;   // a 32-element sub-block's ql and qh bytes
    static constexpr int kMOff = 128, kMPad = 16;
    static constexpr int kConvRow = 40;   // 8 words {D of k-step 0, D of k-step 1}, in step order; pad
    static constexpr bool kPairedNibbles = false, kQh = true, kConvGlobal = true;
    __device__ static constexpr int x_block(int kl, int e) { return (kl & 4) + ((kl >> 1) & 1) + 2 * e; }
    using StepMeta = uint2;   // the D pairs of the step's two sub-blocks
    __device__ static void scales(StepMeta m, int e, __half2& d0, __half2& d1) {
        const __half2 dd = as_h2(e ? m.y : m.x);
        d0 = __low2half2(dd);
        d1 = __high2half2(dd);
    }
    struct ConvIn {
        uint4 sc;       // the 16 int8 scales
        uint32_t d;     // f16 d in the low half
    };
    __device__ static ConvIn fetch(const uint8_t* meta, const uint8_t* meta2, int64_t block, bool ok) {
        ConvIn c{make_uint4(0u, 0u, 0u, 0u), 0u};
        if (ok) {
            c.sc = __ldg(reinterpret_cast<const uint4*>(meta) + block);
            c.d = __ldg(reinterpret_cast<const unsigned short*>(meta2) + block);
        }
        return c;
    }
    // Sub-block s = 4n + j goes to word 4n + 2 (j & 1) + (j >> 1), where step 4n + 2 (j & 1) reads
    // it as its block j >> 1. Scales 2s, 2s + 1 are bytes 2s, 2s + 1: int8 as 1024 + 128 + sc.
    __device__ static void convert(const ConvIn& c, uint8_t* out) {
        const __half2 d = __low2half2(as_h2(c.d));
        const uint32_t w[4] = {c.sc.x, c.sc.y, c.sc.z, c.sc.w};
        uint32_t* o = reinterpret_cast<uint32_t*>(out);
        const __half2 bias = as_h2(0x64806480u);
#pragma unroll
        for (int k = 0; k < 4; ++k) {   // scales 4k..4k+3: sub-blocks 2k, 2k + 1
            const uint32_t v = w[k] ^ 0x80808080u;
            const __half2 lo = __hmul2(__hsub2(as_h2(__byte_perm(v, 0x64646464u, 0x5140)), bias), d);
            const __half2 hi = __hmul2(__hsub2(as_h2(__byte_perm(v, 0x64646464u, 0x5342)), bias), d);
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int sb = 2 * k + u, j = sb & 3;
                o[(sb & 4) + 2 * (j & 1) + (j >> 1)] = as_u32(u ? hi : lo);
            }
        }
    }
    // w0, w1: ql word t of the step's chunks (k-steps 0, 1); h0, h1: qh words 8n + t, 8n + 4 + t;
    // j: the sub-block's place in its half (its qh bits 2j, 2j + 1); e: its nibble.
    __device__ static void dequant(uint32_t w0, uint32_t w1, uint32_t h0, uint32_t h1, int j, int e, __half2 d0,
                                   __half2 d1, uint32_t (&k0)[2], uint32_t (&k1)[2]) {
        const __half2 bias = as_h2(0x64206420u);   // 1024 + 32
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            const int sh = 8 * s + 4 * e, hs = 8 * s + 2 * j;
            // the two high bits to bits 4-5 of each half (shifts by a constant after unrolling)
            const uint32_t g0 = hs >= 4 ? h0 >> (hs - 4) : h0 << (4 - hs);
            const uint32_t g1 = hs >= 4 ? h1 >> (hs - 4) : h1 << (4 - hs);
            const uint32_t v0 = and_or<0x000F000Fu, 0x64006400u>(w0 >> sh) | (g0 & 0x00300030u);
            const uint32_t v1 = and_or<0x000F000Fu, 0x64006400u>(w1 >> sh) | (g1 & 0x00300030u);
            k0[s] = as_u32(__hmul2(__hsub2(as_h2(v0), bias), d0));
            k1[s] = as_u32(__hmul2(__hsub2(as_h2(v1), bias), d1));
        }
    }
};

// Shared-memory layout of one format and token tile (byte offsets within a stage).
template <class F, int NJ, int kWG>
struct Layout {
    static constexpr int kBM = Cta<kWG>::kBM;
    static constexpr int kBN = 8 * NJ;
    static constexpr int kKB = kRowBytes / F::kQB;   // blocks a stage
    static constexpr int kMRow = kKB * F::kMB;       // meta bytes of a row per stage: 8, 16 or 32
    // Bytes from one stage of a row to the next in memory: quants and meta (split regions), or the
    // super-block (raw).
    static constexpr int kQStride = F::kRawBlock ? F::kRawBlock : kRowBytes;
    static constexpr int kMStride = F::kRawBlock ? F::kRawBlock : kMRow;
    static constexpr int kXChunks = kKB * 4;         // 16-byte chunks of f16 x of a token per stage
    static constexpr int kMPitch = kMRow + F::kMPad;   // a row's meta in shared memory
    static constexpr int kW = 0, kM = kW + kBM * kRowBytes,
                         kX = (kM + kBM * kMPitch + 1023) / 1024 * 1024;   // x at the swizzle's 1024-byte period
    static constexpr int kStage = kX + kBN * kXChunks * 16;
    // The converted meta of the stage being multiplied (kConvRow formats), after the stages.
    static constexpr int kConvBytes = kBM * F::kConvRow;
    static constexpr int kStages = std::min(kMaxStages, (kSmemLimit - kConvBytes) / kStage);
    static constexpr int kC = kStages * kStage;
    // Where a fragment row's StepMeta lie: the stage's copied meta, or the converted rows.
    static constexpr int kMetaRow = F::kConvRow ? F::kConvRow : kMRow;
    static constexpr int kMetaBlock = F::kConvRow ? 4 : F::kMB;
    static constexpr int kAccRow = kBM + 4;   // floats; +4: a warp's fragment stores hit 32 banks
    static constexpr int kSmem = std::max(kC + kConvBytes, kBN * kAccRow * 4);
    static_assert(kStages >= 2, "a stage does not fit twice in shared memory");
    static_assert(kKB % 2 == 0 && 32 * kKB <= kDqAlign, "stages hold pairs of blocks and divide kDqAlign");
    static_assert(kBN % 16 == 0, "x copies: whole swizzle periods of 8 tokens");
    static_assert(kStage % 1024 == 0, "x panels start at the swizzle's 1024-byte period");
    static_assert(!F::kRawBlock || (F::kRawBlock % 16 == 0 && F::kQOff % 16 == 0 && F::kMOff % 16 == 0 &&
                                    kMRow % 16 == 0 && kMPitch % 16 == 0 && kKB == 8),
                  "a super-block a stage, its quants and meta in 16-byte chunks");
};

// Up to kMaxWeights weights of one format and width that read the same x, in one launch: their
// row tiles follow each other along grid z, so small projections (Q, K, V; gate, up) fill the
// GPU together instead of each leaving most of it idle behind its own pipeline fill and tail.
struct Params {
    const uint8_t* wq[kMaxWeights];     // quants regions
    const uint8_t* meta[kMaxWeights];   // meta regions
    const uint8_t* meta2[kMaxWeights];  // meta2 regions (Q6_K's d)
    float* y[kMaxWeights];              // [n_tok][n_out[i]]
    int32_t n_out[kMaxWeights];
    int32_t tile_end[kMaxWeights];      // weight i's row tiles end at grid z tile_end[i]
    int32_t n_weights;
    const __half* xh;                   // [n_tok][n_blocks * 32], gemm_dq_input's order
    int32_t n_blocks, n_tok;            // n_blocks: 32-element blocks of a row
    int32_t k_stages;                   // stages of a whole row
    int32_t split_stages;               // stages of one K split
};

// This CTA's weight (picked with selects, so the parameter arrays are never indexed dynamically)
// and its first row within it.
struct CtaWeight {
    const uint8_t *wq, *meta, *meta2;
    float* y;
    int32_t n_out, row0;
};
template <int kBM>
__device__ __forceinline__ CtaWeight cta_weight(const Params& p) {
    const int z = int(blockIdx.z);
    CtaWeight c{p.wq[0], p.meta[0], p.meta2[0], p.y[0], p.n_out[0], z * kBM};
#pragma unroll
    for (int i = 1; i < kMaxWeights; ++i)
        if (i < p.n_weights && z >= p.tile_end[i - 1])
            c = {p.wq[i], p.meta[i], p.meta2[i], p.y[i], p.n_out[i], (z - p.tile_end[i - 1]) * kBM};
    return c;
}

// Row of lane group g of m16 tile i of this warp: mma.sync gives a warp 32 consecutive rows (two
// m16 tiles); wgmma gives warpgroup G its kMT m64 tiles from row 64 kMT G, in each of which warp
// w's A fragment is the rows from 16 (w % 4).
template <int kWG>
__device__ __forceinline__ int tile_row(int warp, int i) {
    constexpr int kMT = Cta<kWG>::kMT;
    return kWG ? (warp >> 2) * 64 * kMT + 64 * i + 16 * (warp & 3) : warp * 32 + 16 * i;
}

// The registers a format converts its stage's scales from (an empty struct where it converts from
// shared memory).
struct NoConvIn {};
template <class F, class = void>
struct ConvInT {
    using type = NoConvIn;
};
template <class F>
struct ConvInT<F, std::void_t<typename F::ConvIn>> {
    using type = typename F::ConvIn;
};
template <class F>
using ConvInOf = typename ConvInT<F>::type;

template <class F, int NJ, int kWG>
__global__ void __launch_bounds__(Cta<kWG>::kThreads, 1) gemm_dq_kernel(Params p) {
    constexpr bool kWg = Cta<kWG>::kWg;
#if !defined(EMBER_WGMMA)
    if constexpr (kWg) {   // the host launches this form only where the sm_90a code was built
        __trap();
        return;
    }
#endif
    using L = Layout<F, NJ, kWG>;
    using C = Cta<kWG>;
    constexpr int kBN = L::kBN, kKB = L::kKB, kStages = L::kStages;
    constexpr int kBM = C::kBM, kThreads = C::kThreads, kMT = C::kMT, kCopyRows = C::kCopyRows;
    extern __shared__ __align__(1024) uint4 smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const CtaWeight cw = cta_weight<kBM>(p);
    const int tok0 = int(blockIdx.y) * kBN, row0 = cw.row0, n_out = cw.n_out;
    const int64_t nb = p.n_blocks;
    const int ks_begin = int(blockIdx.x) * p.split_stages;
    const int n_st = max(0, min(p.k_stages, ks_begin + p.split_stages) - ks_begin);
    pdl_trigger();

    // The copies of a stage (slot k of a copy loop: thread tid's k-th 16-byte chunk), addressed
    // from per-thread bases that advance by one stage's bytes: rows past n_out and tokens past
    // n_tok read as zeros (a zero scale or activation adds 0 to every sum).
    //   quants: row (tid >> 3) + kCopyRows k, chunk tid & 7, at chunk ^ (row & 7)
    //   meta:   kMRow bytes a row in chunks of up to 16, row tid / kMChunks + k * kMRows
    //   x:      token row (tid >> 3) + kCopyRows k of the (panel, token) rows, chunk tid & 7: a
    //           quarter-warp copies one token's 128 bytes of a panel
    // (kCopyRows is a multiple of 8, so a slot's rows and tokens keep their swizzle, row & 7.)
    constexpr int kMChunk = L::kMRow < 16 ? L::kMRow : 16, kMChunks = L::kMRow / kMChunk;
    constexpr int kMRows = kThreads / kMChunks, kXRows = kBN * kKB / 2;
    static_assert(kThreads % kMChunks == 0 && kBM % kCopyRows == 0, "copy slots keep their row");
    const int64_t kb_begin = int64_t(ks_begin) * kKB;
    const int w_r = tid >> 3, w_c = tid & 7;
    const int64_t ks_row = p.k_stages;   // stages of a row
    const uint8_t* w_src = cw.wq + F::kQOff + ((row0 + w_r) * ks_row + ks_begin) * L::kQStride + 16 * w_c;
    const int64_t w_step = kCopyRows * ks_row * L::kQStride;
    const int w_dst = L::kW + w_r * kRowBytes + ((w_c ^ (w_r & 7)) << 4);
    const int m_r = tid / kMChunks, m_c = tid % kMChunks;
    const uint8_t* m_base = F::kQh ? cw.wq : cw.meta;   // Q6_K: qh, in the quants region
    const uint8_t* m_src = m_base + F::kMOff + ((row0 + m_r) * ks_row + ks_begin) * L::kMStride + kMChunk * m_c;
    const int m_dst = L::kM + m_r * L::kMPitch + kMChunk * m_c;
    const int x_row = tid >> 3, x_c = tid & 7;
    const __half* x_src = p.xh + (tok0 * nb + kb_begin) * 32 + 8 * x_c;   // token tok0's row of the split
    const int32_t x_row_halves = int32_t(nb * 32), x_tokens = p.n_tok - tok0;
    const int x_dst = L::kX + ((x_c ^ (x_row & 7)) << 4);   // (row & 7 is the token's: kBN % 8 == 0)
    auto load_weights = [&](int s, int rel) {   // rel: the stage's index within the split
        uint8_t* st = smem + s * L::kStage;
#pragma unroll
        for (int k = 0; k < kBM / kCopyRows; ++k) {
            const bool ok = row0 + w_r + kCopyRows * k < n_out;
            cp_async16_zfill_l2_256(st + w_dst + kCopyRows * k * kRowBytes,
                                    ok ? w_src + k * w_step + rel * L::kQStride : cw.wq, ok);
        }
#pragma unroll
        for (int k = 0; k < (kBM + kMRows - 1) / kMRows; ++k) {
            const int r = m_r + k * kMRows;
            if (kBM % kMRows != 0 && r >= kBM) break;   // slots past the tile's rows (wgmma form)
            const bool ok = row0 + r < n_out;
            const uint8_t* src = ok ? m_src + k * kMRows * ks_row * L::kMStride + rel * L::kMStride : m_base;
            uint8_t* dst = st + m_dst + k * kMRows * L::kMPitch;
            if constexpr (kMChunk == 16) cp_async16_zfill_l2_256(dst, src, ok);
            else cp_async8_zfill(dst, src, ok);
        }
    };
    auto load_x = [&](int s, int rel) {
        uint8_t* st = smem + s * L::kStage;
#pragma unroll
        for (int k = 0; k < (kXRows + kCopyRows - 1) / kCopyRows; ++k) {
            const int r = x_row + kCopyRows * k, n = r % kBN, panel = r / kBN;
            if (kXRows % kCopyRows != 0 && r >= kXRows) break;   // slots past the stage's rows (wgmma form)
            const bool ok = n < x_tokens;
            const __half* src = ok ? x_src + (n * x_row_halves + rel * kKB * 32 + 64 * panel) : p.xh;
            cp_async16_zfill(st + x_dst + (panel * kBN + n) * 128, src, ok);
        }
    };

    // Weights do not depend on the previous kernel: their first stages go out before pdl_wait.
    for (int s = 0; s < kStages - 1; ++s)
        if (s < n_st) load_weights(s, s);
    pdl_wait();
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_st) load_x(s, s);
        cp_async_commit();
    }

    float acc[kMT][NJ][4] = {};
    const int nj_valid = min(NJ, (p.n_tok - tok0 + 7) / 8);
    // ldmatrix.x4 of a m16 tile: lanes 8q..8q+7 address rows 8 * (q & 1) + (lane & 7), chunk
    // q >> 1 of the step's quants: registers (row g, chunk 0), (g + 8, 0), (g, 1), (g + 8, 1),
    // word t of each. A step is two nibble blocks (a chunk each) or one Q8_0 block (words t, t + 4).
    constexpr int kStepBlocks = 32 / F::kQB;
    using StepMeta = typename F::StepMeta;
    int q_off[kMT], m_off[kMT], h_off[kMT];
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
        const int r = tile_row<kWG>(warp, i) + 8 * ((lane >> 3) & 1) + (lane & 7);
        q_off[i] = L::kW + r * kRowBytes + (((lane >> 4) ^ (r & 7)) << 4);   // step 0; step kl: chunk ^ kl * kQB / 16
        m_off[i] = (F::kConvRow ? L::kC : L::kM) + (tile_row<kWG>(warp, i) + g) * L::kMetaRow;
        h_off[i] = L::kM + (tile_row<kWG>(warp, i) + g) * L::kMPitch + 4 * t;   // Q6_K: qh word t of row g
    }
    // The B fragments of the mma.sync form: ldmatrix.x4 of block kb's four chunks for tokens
    // 8 j .. 8 j + 7 gives lane (g, t) word t of each, b0 b1 of k-step 0 and of k-step 1. Lanes
    // 8 m .. 8 m + 7 address chunk m of the block for token lane & 7 (even blocks: chunks 0-3 of
    // the panel, odd: 4-7).
    const int x_lane = L::kX + (lane & 7) * 128;
    const int x_even = ((lane >> 3) ^ (lane & 7)) << 4, x_odd = ((4 + (lane >> 3)) ^ (lane & 7)) << 4;
    // Q6_K: hq[i][h] = qh words 8n + t, 8n + 4 + t of row g (h = 0) or g + 8 (h = 1), n = kl / 4.
    auto load_step = [&](const uint8_t* st, int kl, uint32_t (&q)[kMT][4], StepMeta(&m)[kMT][2],
                         uint32_t (&hq)[kMT][2][2]) {
        const uint8_t* mb = F::kConvRow ? smem : st;
#pragma unroll
        for (int i = 0; i < kMT; ++i) {
            ldmatrix_x4(q[i], st + (q_off[i] ^ ((kl * F::kQB / 16) << 4)));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                m[i][h] = *reinterpret_cast<const StepMeta*>(mb + m_off[i] + 8 * h * L::kMetaRow + kl * L::kMetaBlock);
                if constexpr (F::kQh) {
                    const uint8_t* hp = st + h_off[i] + 8 * h * L::kMPitch + (kl >> 2) * 32;
                    hq[i][h][0] = *reinterpret_cast<const uint32_t*>(hp);
                    hq[i][h][1] = *reinterpret_cast<const uint32_t*>(hp + 16);
                }
            }
        }
    };
#if defined(EMBER_WGMMA)
    const uint64_t x_desc = wgmma_desc_sw128(smem + L::kX);   // B tiles of the wgmma form
#endif
    // Formats converting from registers (Q6_K): the thread of row tid loads its row's input a stage
    // ahead (scales and d; zeros past n_out), so the loads' latency hides behind a stage's work.
    [[maybe_unused]] const bool conv_row = tid < kBM && row0 + tid < n_out;
    [[maybe_unused]] const int64_t conv_block = (row0 + tid) * ks_row + ks_begin;
    [[maybe_unused]] ConvInOf<F> conv_in{};
    if constexpr (F::kConvGlobal) {
        if (n_st > 0) conv_in = F::fetch(cw.meta, cw.meta2, conv_block, conv_row);
    }
    int s_read = 0, s_write = kStages - 1;
    for (int ks = 0; ks < n_st; ++ks) {
        cp_async_wait<kStages - 2>();
#if defined(EMBER_WGMMA)
        if constexpr (kWg) fence_proxy_async();   // the copies become visible to the tensor cores' reads
#endif
        __syncthreads();   // stage ks landed for every thread; stage ks - 1 is free for the prefetch
        if (ks + kStages - 1 < n_st) {
            load_weights(s_write, ks + kStages - 1);
            load_x(s_write, ks + kStages - 1);
        }
        cp_async_commit();
        s_write = s_write + 1 == kStages ? 0 : s_write + 1;
        const uint8_t* st = smem + s_read * L::kStage;
        if constexpr (F::kConvRow != 0) {
            // The stage's scales -> the rows' sub-block scales in f16, once for all the warps reading
            // them; the barrier above saw every read of the previous stage's.
            if constexpr (F::kConvGlobal) {
                if (tid < kBM) F::convert(conv_in, smem + L::kC + tid * F::kConvRow);
                if (ks + 1 < n_st) conv_in = F::fetch(cw.meta, cw.meta2, conv_block + ks + 1, conv_row);
            } else {
                for (int r = tid; r < kBM; r += kThreads)
                    F::convert(st + L::kM + r * L::kMPitch, smem + L::kC + r * F::kConvRow);
            }
            __syncthreads();
        }
#if defined(EMBER_WGMMA)
        const uint64_t st_desc = x_desc + uint64_t((s_read * L::kStage) >> 4);
#endif
        s_read = s_read + 1 == kStages ? 0 : s_read + 1;
        uint32_t q[kMT][4];
        StepMeta meta[kMT][2];   // [m16 tile][row g, g + 8]
        uint32_t hq[kMT][2][2];   // Q6_K's qh words [m16 tile][row g, g + 8][k-step]
        load_step(st, 0, q, meta, hq);
#pragma unroll
        for (int kl = 0; kl < kKB; kl += kStepBlocks) {
            uint32_t q_next[kMT][4];   // the next step's quants and scales load while this one computes
            StepMeta meta_next[kMT][2];
            uint32_t hq_next[kMT][2][2];
            if (kl + kStepBlocks < kKB) load_step(st, kl + kStepBlocks, q_next, meta_next, hq_next);
#pragma unroll
            for (int e = 0; e < kStepBlocks; ++e) {
                const int kb = F::x_block(kl, e);
                uint32_t a[kMT][2][4];   // [m16 tile][k-step][fragment register]
#pragma unroll
                for (int i = 0; i < kMT; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {   // rows g, g + 8
                        __half2 d, m;
                        F::scales(meta[i][h], e, d, m);
                        uint32_t k0[2], k1[2];
                        if constexpr (F::kPairedNibbles) F::dequant(q[i][h], q[i][2 + h], e, d, m, k0, k1);
                        else if constexpr (F::kQh)
                            F::dequant(q[i][h], q[i][2 + h], hq[i][h][0], hq[i][h][1], ((kl >> 1) & 1) + 2 * e, e, d, m,
                                       k0, k1);
                        else if constexpr (F::kQB == 16) F::dequant(q[i][2 * e + h], 0u, d, m, k0, k1);
                        else F::dequant(q[i][h], q[i][2 + h], d, m, k0, k1);
                        a[i][0][h] = k0[0];
                        a[i][0][2 + h] = k0[1];
                        a[i][1][h] = k1[0];
                        a[i][1][2 + h] = k1[1];
                    }
                if constexpr (kWg) {
#if defined(EMBER_WGMMA)
                    // One group a k-step; the wait lets the previous group finish before the next
                    // block's A fragments are written.
#pragma unroll
                    for (int k = 0; k < 2; ++k) {
                        // panel kb / 2, 64 bytes into it for odd blocks, 32 more for k-step 1 (16-byte units)
                        const uint64_t desc = st_desc + uint64_t((kb >> 1) * kBN * 8 + (kb & 1) * 4 + 2 * k);
                        wgmma_fence();
#pragma unroll
                        for (int i = 0; i < kMT; ++i) wgmma_f16<kBN>(&acc[i][0][0], a[i][k], desc);
                        wgmma_commit();
                        wgmma_wait<1>();
                    }
#endif
                } else {
                    uint32_t b[NJ][4];
#pragma unroll
                    for (int j = 0; j < NJ; ++j)
                        if (j < nj_valid)
                            ldmatrix_x4(b[j],
                                        st + x_lane + (kb >> 1) * kBN * 128 + j * 1024 + (kb & 1 ? x_odd : x_even));
                    // Issue order: the 2 * NJ mmas of a k-step are independent, so an accumulator's
                    // next mma comes 2 * nj_valid issues after its last (mma.sync keeps program order).
#pragma unroll
                    for (int k = 0; k < 2; ++k)
#pragma unroll
                        for (int j = 0; j < NJ; ++j)
                            if (j < nj_valid) {   // warp-uniform
#pragma unroll
                                for (int i = 0; i < kMT; ++i)
                                    mma16816(acc[i][j], a[i][k], b[j][2 * k], b[j][2 * k + 1]);
                            }
                }
            }
            if (kl + kStepBlocks < kKB) {
#pragma unroll
                for (int i = 0; i < kMT; ++i) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) q[i][r] = q_next[i][r];
                    meta[i][0] = meta_next[i][0];
                    meta[i][1] = meta_next[i][1];
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        hq[i][h][0] = hq_next[i][h][0];
                        hq[i][h][1] = hq_next[i][h][1];
                    }
                }
            }
        }
#if defined(EMBER_WGMMA)
        if constexpr (kWg) wgmma_wait<0>();   // the stage's reads are done before it is refilled
#endif
    }
#if defined(EMBER_WGMMA)
    if constexpr (kWg) {
#pragma unroll
        for (int i = 0; i < kMT; ++i)
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) reg_fence(acc[i][j][c]);
    }
#endif
    cp_async_wait<0>();
    __syncthreads();

    // The CTA's (partial) tile, [token][row], over the pipeline's shared memory; c0, c1: row g,
    // tokens 2t, 2t + 1; c2, c3: row g + 8.
    float* tile = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
            store_acc_transposed(tile, L::kAccRow, tile_row<kWG>(warp, i) + g, 8 * j + 2 * t, acc[i][j]);
    const int n_tk = min(kBN, p.n_tok - tok0), n_r = min(kBM, n_out - row0);
    // Four consecutive rows of a token a thread, consecutive threads the next rows: coalesced
    // stores of y. The sum over the splits runs in rank order whatever the timing.
    auto store = [&](int e, const float4& v) {
        const int tk = e / (kBM / 4), r = 4 * (e % (kBM / 4));
        float* out = cw.y + int64_t(tok0 + tk) * n_out + row0 + r;
        const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int c = 0; c < 4; ++c)
            if (r + c < n_r) out[c] = vs[c];
    };
    auto at = [&](const float* tl, int e) {
        return *reinterpret_cast<const float4*>(tl + (e / (kBM / 4)) * L::kAccRow + 4 * (e % (kBM / 4)));
    };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int n_split = int(gridDim.x);
    if (n_split > 1) {
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();   // every partial tile written
        for (int e = int(cluster.block_rank()) * kThreads + tid; e < n_tk * kBM / 4; e += n_split * kThreads) {
            float4 parts[kMaxSplit];
#pragma unroll
            for (int q = 0; q < kMaxSplit; ++q)
                if (q < n_split) parts[q] = at(cluster.map_shared_rank(tile, q), e);
            float4 sum = parts[0];
#pragma unroll
            for (int q = 1; q < kMaxSplit; ++q)
                if (q < n_split) {
                    sum.x += parts[q].x;
                    sum.y += parts[q].y;
                    sum.z += parts[q].z;
                    sum.w += parts[q].w;
                }
            store(e, sum);
        }
        cluster.sync();   // no CTA leaves while another reads its shared memory
        return;
    }
#endif
    __syncthreads();
    for (int e = tid; e < n_tk * kBM / 4; e += kThreads) store(e, at(tile, e));
}

// Activations in the kernel's K order (dq_order.cuh): thread i reads elements 16 i .. 16 i + 15
// and writes their evens, then their odds, as two 16-byte chunks.
__global__ void gemm_dq_input_kernel(const float4* __restrict__ x, uint4* __restrict__ xh, int64_t n_halves) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_halves) return;
    const float4 a = x[4 * i], b = x[4 * i + 1], c = x[4 * i + 2], d = x[4 * i + 3];
    xh[2 * i] = make_uint4(pack_half2(a.x, a.z), pack_half2(b.x, b.z), pack_half2(c.x, c.z), pack_half2(d.x, d.z));
    xh[2 * i + 1] = make_uint4(pack_half2(a.y, a.w), pack_half2(b.y, b.w), pack_half2(c.y, c.w), pack_half2(d.y, d.w));
}

// A launch's grid: the row tiles of its weights one after another (grid z; weight i's end at
// tile_end[i]), token tiles (y), K splits (x), and its cost in stages of its tile: waves of one CTA
// an SM (where two CTAs share an SM, each runs at about half speed) x (stages of the longest split
// + a CTA's fixed cost).
struct Grid {
    int32_t tile_end[kMaxWeights] = {};
    int64_t m_tiles = 0, n_tiles = 0;
    int k_stages = 0, split = 1;
    int64_t cost = 0;
};

// Cost of `ctas` CTAs, `slots` of them at once, each stages_per_cta stages long. The fixed cost (the
// pipeline's fill, the cluster's sum of partial tiles) is about kCtaCostStages stages' time:
// counting it picks fewer, longer splits than stages alone would.
int64_t waves_cost(int64_t ctas, int slots, int stages_per_cta) {
    return (ctas + slots - 1) / slots * (stages_per_cta + kCtaCostStages);
}

// The fewest K splits that minimize the cost, for slots[s] CTAs resident at once in clusters of s.
int pick_split(int64_t tiles, int k_stages, const int (&slots)[kMaxSplit + 1]) {
    int best = 1;
    int64_t best_t = waves_cost(tiles, slots[1], k_stages);
    for (int s = 2; s <= std::min(kMaxSplit, k_stages); ++s) {
        if (slots[s] == 0) continue;
        const int64_t t_s = waves_cost(tiles * s, slots[s], (k_stages + s - 1) / s);
        if (t_s < best_t) {
            best = s;
            best_t = t_s;
        }
    }
    return best;
}

// CTAs of one kernel resident at once in clusters of each size (one CTA an SM, but a cluster's
// CTAs share a GPC, so large clusters leave SMs over); clusters need Hopper, else one split only.
struct Slots {
    int n[kMaxSplit + 1];
    int sms;
};
template <class F, int NJ, int kWG>
const Slots& slots() {
    using L = Layout<F, NJ, kWG>;
    static const Slots r = [] {
        auto* kernel = gemm_dq_kernel<F, NJ, kWG>;
        // above 48 KB of dynamic shared memory needs the opt-in
        EMBER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmem));
        int dev = 0;
        EMBER_CUDA_CHECK(cudaGetDevice(&dev));
        Slots out{};
        int per_sm = 0, sms = 0;
        EMBER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cta<kWG>::kThreads, L::kSmem));
        EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        out.n[0] = out.n[1] = std::max(1, per_sm * sms);
        out.sms = std::max(1, sms);
        for (int c = 2; c <= kMaxSplit; ++c) {
            int clusters = 0;
            if (device_is_sm90()) {
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute attr[1];
                attr[0].id = cudaLaunchAttributeClusterDimension;
                attr[0].val.clusterDim.x = unsigned(c);
                attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
                cfg.gridDim = dim3(unsigned(c));
                cfg.blockDim = dim3(Cta<kWG>::kThreads);
                cfg.dynamicSmemBytes = L::kSmem;
                cfg.attrs = attr;
                cfg.numAttrs = 1;
                EMBER_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
            }
            out.n[c] = clusters * c;   // 0: no clusters of this size (never picked)
        }
        return out;
    }();
    return r;
}

template <class F, int NJ, int kWG>
Grid plan(const DeviceWeight* const* ws, int count, int32_t n_tok) {
    using L = Layout<F, NJ, kWG>;
    Grid g;
    for (int i = 0; i < count; ++i) {
        g.m_tiles += (ws[i]->n_out + L::kBM - 1) / L::kBM;
        g.tile_end[i] = int32_t(g.m_tiles);
    }
    g.n_tiles = (n_tok + L::kBN - 1) / L::kBN;
    g.k_stages = int(ws[0]->n_in / 32 / L::kKB);
    const Slots& sl = slots<F, NJ, kWG>();
    g.split = pick_split(g.m_tiles * g.n_tiles, g.k_stages, sl.n);
    g.cost = waves_cost(g.m_tiles * g.n_tiles * g.split, sl.sms, (g.k_stages + g.split - 1) / g.split);
    return g;
}

template <class F, int NJ, int kWG>
void launch(const DeviceWeight* const* ws, float* const* ys, int count, const __half* xh, int32_t n_tok, const Grid& g,
            cudaStream_t s) {
    using L = Layout<F, NJ, kWG>;
    Params p{};
    for (int i = 0; i < count; ++i) {
        p.wq[i] = ws[i]->base;
        p.meta[i] = ws[i]->base + ws[i]->layout.meta_off;
        p.meta2[i] = ws[i]->base + ws[i]->layout.meta2_off;
        p.y[i] = ys[i];
        p.n_out[i] = int32_t(ws[i]->n_out);
        p.tile_end[i] = g.tile_end[i];
    }
    p.n_weights = count;
    p.xh = xh;
    p.n_blocks = int32_t(ws[0]->n_in / 32);
    p.n_tok = n_tok;
    p.k_stages = g.k_stages;
    p.split_stages = (g.k_stages + g.split - 1) / g.split;
    launch_pdl_cluster(gemm_dq_kernel<F, NJ, kWG>, dim3(unsigned(g.split), unsigned(g.n_tiles), unsigned(g.m_tiles)),
                       dim3(Cta<kWG>::kThreads), size_t(L::kSmem), unsigned(g.split), s, p);
    EMBER_CUDA_LAUNCHED("gemm_dq");
}

// The wgmma form's row tile for one launch: the grid of the lower cost, a 192-row stage counted
// as kStage192 / kStage256 of a 256-row one (each stage's time on the H100 and H200 at 32-128
// tokens, where the 192-row CTA's twelve warps also hide more of its latency).
constexpr int kStage192 = 4, kStage256 = 5;
template <class F, int NJ>
void launch_wgmma(const DeviceWeight* const* ws, float* const* ys, int count, const __half* xh, int32_t n_tok, int rows,
                  cudaStream_t s) {
    const Grid g2 = plan<F, NJ, 2>(ws, count, n_tok), g3 = plan<F, NJ, 3>(ws, count, n_tok);
    const bool tall = rows ? rows == 256 : g2.cost * kStage256 <= g3.cost * kStage192;
    if (tall) launch<F, NJ, 2>(ws, ys, count, xh, n_tok, g2, s);
    else launch<F, NJ, 3>(ws, ys, count, xh, n_tok, g3, s);
}

template <class F>
void launch_tokens(const DeviceWeight* const* ws, float* const* ys, int count, const __half* xh, int32_t n_tok,
                   const GemmDqForm& form, cudaStream_t s) {
    const int rows = form.rows;
    // The K-quants' stages do not fit twice with a 128-token x tile: tiles of 64 at most (the kernel
    // choice gives them up to 64 tokens).
    constexpr int kWideNJ = F::kRawBlock ? 8 : 16;
    if (form.wgmma) {
        if (n_tok <= 16) launch_wgmma<F, 2>(ws, ys, count, xh, n_tok, rows, s);
        else if (n_tok <= 32) launch_wgmma<F, 4>(ws, ys, count, xh, n_tok, rows, s);
        // 129..192 tokens: three tiles of 64 (two of 128 would multiply a third of zeros)
        else if (n_tok <= 64 || (n_tok > 128 && n_tok <= 192)) launch_wgmma<F, 8>(ws, ys, count, xh, n_tok, rows, s);
        else launch_wgmma<F, kWideNJ>(ws, ys, count, xh, n_tok, rows, s);
        return;
    }
    auto mma = [&](auto nj) {
        constexpr int NJ = decltype(nj)::value;
        launch<F, NJ, 0>(ws, ys, count, xh, n_tok, plan<F, NJ, 0>(ws, count, n_tok), s);
    };
    if (n_tok <= 16) mma(std::integral_constant<int, 2>{});
    else if (n_tok <= 32) mma(std::integral_constant<int, 4>{});
    else mma(std::integral_constant<int, 8>{});
}

}  // namespace

bool gemm_dq_wgmma_built() {
#if defined(EMBER_CUDA_SM90A)
    return true;
#else
    return false;
#endif
}

void gemm_dq_input(const float* x, __half* xh, int32_t n_tok, int64_t n, cudaStream_t s) {
    if (n % 32 || reinterpret_cast<uintptr_t>(x) % 16)
        fail("cuda gemm_dq_input: width ", n, " is not a multiple of 32 or x is not 16-byte aligned");
    const int64_t n_halves = int64_t(n_tok) * n / 16;
    if (n_halves == 0) return;
    launch_pdl(gemm_dq_input_kernel, unsigned((n_halves + 255) / 256), 256, s, reinterpret_cast<const float4*>(x),
               reinterpret_cast<uint4*>(xh), n_halves);
    EMBER_CUDA_LAUNCHED("gemm_dq_input");
}

void gemm_dq(const DeviceWeight* const* ws, float* const* ys, int count, const __half* xh, int32_t n_tok,
             const GemmDqForm& form, cudaStream_t s) {
    if (form.rows != 0 && form.rows != 192 && form.rows != 256)
        fail("cuda gemm_dq: the wgmma row tile is 192 or 256 (0: per launch), got ", form.rows);
    if (form.wgmma && !gemm_dq_wgmma_built()) fail("cuda gemm_dq: the wgmma form needs a build with sm_90a code");
    if (n_tok <= 0 || count <= 0) return;
    if (count > kMaxGemmDqWeights) fail("cuda gemm_dq: ", count, " weights in one launch, at most ", kMaxGemmDqWeights);
    const DeviceWeight& w = *ws[0];
    if (!gemm_dq_supported(w.type, w.n_in) && !gemm_kq_supported(w.type, w.n_in))
        fail("cuda gemm_dq: no kernel for ", block_info(w.type).name, " rows of ", w.n_in);
    for (int i = 1; i < count; ++i)
        if (ws[i]->type != w.type || ws[i]->n_in != w.n_in)
            fail("cuda gemm_dq: the weights of one launch must share their format and width");
    switch (w.type) {
        case GGMLType::Q4_0: launch_tokens<DqQ4_0>(ws, ys, count, xh, n_tok, form, s); break;
        case GGMLType::Q4_1: launch_tokens<DqQ4_1>(ws, ys, count, xh, n_tok, form, s); break;
        case GGMLType::Q4_K: launch_tokens<DqQ4_K>(ws, ys, count, xh, n_tok, form, s); break;
        case GGMLType::Q6_K: launch_tokens<DqQ6_K>(ws, ys, count, xh, n_tok, form, s); break;
        default: launch_tokens<DqQ8_0>(ws, ys, count, xh, n_tok, form, s); break;
    }
}

void gemm_dq(const DeviceWeight& w, float* y, const __half* xh, int32_t n_tok, const GemmDqForm& form, cudaStream_t s) {
    const DeviceWeight* ws[1] = {&w};
    float* ys[1] = {y};
    gemm_dq(ws, ys, 1, xh, n_tok, form, s);
}

}  // namespace cuda
}  // namespace ember
