// Decode GEMV: y [n_tok][n_out] = x [n_tok][n_in] * W^T for n_tok <= 8, every weight type.
// One warp per output row, or up to four for long rows (warps_per_row); lanes stride over the
// row's units (gemv_formats.cuh) so a warp's 16-byte loads are contiguous, and all n_tok
// tokens share each weight load. The 32-element block formats take one warp per row in the
// CPU's summation order instead (gemv_legacy.cuh).
#include <type_traits>

#include "common.cuh"
#include "gemv_formats.cuh"
#include "gemv_legacy.cuh"
#include "kernels.h"
#include "launch.h"

namespace ember {
namespace cuda {

namespace {

constexpr int kRowsPerBlock = 4;   // warps per block

// Up to kMaxGemvBatch weights of one type and width that read the same activations: their
// CTAs are laid end to end in one grid (start[i] = first CTA of weight i).
struct GemvBatch {
    GemvParams common;                       // x, widths, units; w/meta/y unused
    const uint8_t* w[kMaxGemvBatch];
    const uint8_t* meta[kMaxGemvBatch];
    const uint8_t* meta2[kMaxGemvBatch];
    float* y[kMaxGemvBatch];
    int64_t n_out[kMaxGemvBatch];
    int32_t start[kMaxGemvBatch];
    int32_t wpr;   // warps per row: 1 or 4 (kRowsPerBlock / wpr rows per CTA)
    QkvRopeStore rope;   // cos_sin null: rows written as they are
};

// Long rows are split over four warps (a 4096-wide f16 row is 512 units: one round of four loads
// per lane; an 11008-wide one 1376). Four rather than two or one for 512-1023 units: measured in
// docs/performance.md.
constexpr int warps_per_row(int32_t units) { return units >= 512 ? 4 : 1; }
// Rows summed in the CPU's order take one warp each.
static_assert(warps_per_row(kLegacyExactMaxWidth / 32) == 1, "CPU-order rows must get one warp per row");

template <class T>
__device__ __forceinline__ T pick(const T (&a)[kMaxGemvBatch], int i) {
    return i == 0 ? a[0] : (i == 1 ? a[1] : a[2]);
}

// acc[r] += row `row` of weight p[r] . x, for R weights of one type and width read together.
// kDepth units per lane and weight are in flight: all their loads are issued before the first is
// used (a 4096-wide Q4_0 row is then a single round trip to memory). Weights do not depend on
// the previous kernel, so the first loads go out before pdl_wait and overlap its tail.
template <class F, int NT, int R>
__device__ __forceinline__ void rows_dot(const GemvParams (&p)[R], int64_t row, int first, int stride,
                                         float (&acc)[R][NT]) {
    constexpr int kDepth = F::kDepth;
    const int units = p[0].units;
    typename F::Data v[R][kDepth];
    auto load = [&](int u0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int k = 0; k < kDepth; ++k)
                if (u0 + k * stride < units) v[r][k] = F::load(p[r], row, u0 + k * stride);
    };
    load(first);
    pdl_wait();
    for (int u0 = first;;) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int k = 0; k < kDepth; ++k)
                if (u0 + k * stride < units) F::template dot<NT>(p[r], u0 + k * stride, v[r][k], acc[r]);
        u0 += kDepth * stride;
        if (u0 >= units) break;
        load(u0);
    }
}

// Sums acc over the wpr warps of each row (warp sums, then in warp order through shared
// memory); true on the lane that holds the row's totals.
template <int R, int NT>
__device__ __forceinline__ bool reduce_row(float (&acc)[R][NT], int wpr) {
    __shared__ float part[kRowsPerBlock][R][NT];
    const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
    if (wpr == 1) return lane == 0;
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) part[warp][r][t] = acc[r][t];
    __syncthreads();
    if (lane != 0 || warp % wpr != 0) return false;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
            for (int w = 1; w < wpr; ++w) acc[r][t] += part[warp + w][r][t];
    return true;
}

// The Q, K, V rows' epilogue with a QkvRopeStore (one warp a row, whole CTAs of rows, so rows 2i
// and 2i + 1 are warps w and w ^ 1 of one CTA): lane 0 holds the row's sums of the NT tokens; lane
// t finishes token t as rope_kv_store_kernel would. wi: 0 q, 1 k, 2 v.
template <int NT>
__device__ __forceinline__ void rope_store_row(const QkvRopeStore& e, int wi, int64_t row, const float (&acc)[NT],
                                               float* y, int64_t n_out) {
    __shared__ float sums[kRowsPerBlock][NT];
    const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x >> 5;
    if (lane == 0)
#pragma unroll
        for (int t = 0; t < NT; ++t) sums[warp][t] = acc[t];
    __syncthreads();
    if (lane >= NT) return;
    const int t = lane, p = e.b.pos[t];
    float v = sums[warp][t];
    if (wi < 2) {
        const float other = sums[warp ^ 1][t];
        const int half = e.head_dim / 2;
        const bool odd = row & 1;
        const float2 r = rope_rotate(odd ? other : v, odd ? v : other,
                                     e.cos_sin[int64_t(p) * half + int(row % e.head_dim) / 2]);
        v = odd ? r.y : r.x;
    }
    y[t * n_out + row] = v;
    if (wi > 0) {
        const int64_t phys = e.b.block_table[int64_t(e.b.seq[t]) * e.b.max_blocks + p / e.block_size];
        (wi == 1 ? e.k_cache : e.v_cache)[(phys * e.block_size + p % e.block_size) * n_out + row] = __float2half_rn(v);
    }
}

// Given only the block size, ptxas holds these kernels to fewer registers than the code wants,
// for more resident CTAs. Asked for one CTA an SM at least, it gives them what they want, and a
// one-token row's loads after the PDL wait go out sooner: on the formats listed that is worth
// more than the resident warps lost (docs/performance.md). The others keep ptxas's choice (0).
template <class F, int NT>
constexpr int gemv_min_ctas() {
    constexpr bool more_registers = std::is_same<F, FmtBlock32<DecodeQ4_0>>::value ||
                                    std::is_same<F, FmtBlock32<DecodeQ4_1>>::value ||
                                    std::is_same<F, FmtBlock32<DecodeQ5_0>>::value ||
                                    std::is_same<F, FmtBlock32<DecodeQ5_1>>::value || std::is_same<F, FmtQ6_K>::value ||
                                    std::is_same<F, FmtFloat<float>>::value ||
                                    std::is_same<F, FmtFloat<__half>>::value ||
                                    std::is_same<F, FmtFloat<__nv_bfloat16>>::value;
    return NT == 1 && more_registers ? 1 : 0;
}

template <class F, int NT, int kMinCtas = gemv_min_ctas<F, NT>()>
__global__ void __launch_bounds__(kRowsPerBlock * kWarp, kMinCtas) gemv_kernel(GemvBatch b) {
    const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x >> 5;
    const int bx = blockIdx.x;
    const int wi = bx >= b.start[2] ? 2 : (bx >= b.start[1] ? 1 : 0);
    GemvParams p[1] = {b.common};
    p[0].w = pick(b.w, wi);
    p[0].meta = pick(b.meta, wi);
    p[0].meta2 = pick(b.meta2, wi);
    const int64_t n_out = pick(b.n_out, wi);
    const int64_t row = int64_t(bx - pick(b.start, wi)) * (kRowsPerBlock / b.wpr) + warp / b.wpr;
    pdl_trigger();
    float acc[1][NT] = {};
    float* y = pick(b.y, wi);
    if constexpr (F::kWholeRow) {   // one warp per row, summed on every lane
        if (row >= n_out) return;
        F::template row_dot<NT>(p[0], row, acc[0]);
        if (b.rope.cos_sin) return rope_store_row<NT>(b.rope, wi, row, acc[0], y, n_out);
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; ++t) y[t * n_out + row] = acc[0][t];
    } else {
        if (row < n_out) rows_dot<F, NT, 1>(p, row, (warp % b.wpr) * kWarp + lane, b.wpr * kWarp, acc);
        if (b.wpr == 1 && row >= n_out) return;   // (split rows keep every warp for the barrier)
        const bool holds_sums = reduce_row(acc, b.wpr);
        if (b.rope.cos_sin) return rope_store_row<NT>(b.rope, wi, row, acc[0], y, n_out);
        if (holds_sums && row < n_out)
#pragma unroll
            for (int t = 0; t < NT; ++t) y[t * n_out + row] = acc[0][t];
    }
}

// Gate and up rows together (weights 0 and 1 of the batch), written as silu(gate) * up: the
// swiglu of float-weight models, whose down projection reads float activations.
template <class F, int NT>
__global__ void __launch_bounds__(kRowsPerBlock * kWarp) gemv_swiglu_kernel(GemvBatch b, float* out) {
    const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x >> 5;
    GemvParams p[2] = {b.common, b.common};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        p[r].w = b.w[r];
        p[r].meta = b.meta[r];
        p[r].meta2 = b.meta2[r];
    }
    const int64_t n_out = b.n_out[0];
    const int64_t row = int64_t(blockIdx.x) * (kRowsPerBlock / b.wpr) + warp / b.wpr;
    pdl_trigger();
    float acc[2][NT] = {};
    if (row < n_out) rows_dot<F, NT, 2>(p, row, (warp % b.wpr) * kWarp + lane, b.wpr * kWarp, acc);
    if (b.wpr == 1 && row >= n_out) return;
    if (reduce_row(acc, b.wpr) && row < n_out)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float g = acc[0][t];
            out[t * n_out + row] = g / (1.f + expf_glibc(-g)) * acc[1][t];   // as gated_act_kernel
        }
}

// Calls f(std::integral_constant<int, NT>) for NT == n_tok: the token count is a template
// parameter of the kernels (their accumulators live in registers).
template <int NT = 1, class Fn>
void with_n_tok(int32_t n_tok, Fn&& f) {
    if constexpr (NT <= kMaxGemvTokens) {
        if (n_tok == NT) return f(std::integral_constant<int, NT>{});
        with_n_tok<NT + 1>(n_tok, f);
    } else {
        fail("cuda gemv: n_tok ", n_tok, " is outside 1..", kMaxGemvTokens);
    }
}

template <class F>
void launch(const GemvBatch& b, unsigned n_ctas, int32_t n_tok, cudaStream_t s) {
    with_n_tok(n_tok, [&](auto nt) {
        launch_pdl(gemv_kernel<F, decltype(nt)::value>, dim3(n_ctas), dim3(kRowsPerBlock * kWarp), s, b);
    });
    EMBER_CUDA_LAUNCHED("gemv");
}

// A 32-element block type: rows in the CPU's order (gemv_legacy.cuh) or the lane-strided one.
template <class D>
void launch_legacy(bool cpu_order, const GemvBatch& b, unsigned n_ctas, int32_t n_tok, cudaStream_t s) {
    if (cpu_order) launch<LegacyRows<D>>(b, n_ctas, n_tok, s);
    else launch<FmtBlock32<D>>(b, n_ctas, n_tok, s);
}

template <class F>
void launch_swiglu(const GemvBatch& b, float* out, unsigned n_ctas, int32_t n_tok, cudaStream_t s) {
    with_n_tok(n_tok, [&](auto nt) {
        launch_pdl(gemv_swiglu_kernel<F, decltype(nt)::value>, dim3(n_ctas), dim3(kRowsPerBlock * kWarp), s, b, out);
    });
    EMBER_CUDA_LAUNCHED("gemv_swiglu");
}

// The units a lane strides over in one of w's rows (gemv_formats.cuh).
int32_t row_units(const DeviceWeight& w) {
    const int64_t nb = w.layout.n_blocks;
    switch (w.type) {
        case GGMLType::Q4_K:
        case GGMLType::Q5_K:
        case GGMLType::Q6_K: return int32_t(nb * 4);
        case GGMLType::Q2_K:
        case GGMLType::Q3_K:
        case GGMLType::IQ4_XS:
        case GGMLType::IQ3_S:
        case GGMLType::IQ3_XXS:
        case GGMLType::IQ2_XXS:
        case GGMLType::IQ2_XS:
        case GGMLType::IQ2_S:
        case GGMLType::IQ1_S:
        case GGMLType::IQ1_M: return int32_t(nb * 8);
        case GGMLType::TQ2_0:
        case GGMLType::NVFP4: return int32_t(nb * 2);
        case GGMLType::TQ1_0: return int32_t(nb);
        case GGMLType::F32: return int32_t(w.n_in / 4);
        case GGMLType::F16:
        case GGMLType::BF16: return int32_t(w.n_in / 8);
        default: return int32_t(nb);   // legacy 32-element blocks
    }
}

}  // namespace

void gemv_swiglu(const DeviceWeight& gate, const DeviceWeight& up, float* out, const float* x, int32_t n_tok,
                 cudaStream_t s) {
    if (gate.type != up.type || gate.n_in != up.n_in || gate.n_out != up.n_out)
        fail("cuda gemv_swiglu: gate and up differ in type or shape");
    GemvBatch b{};
    GemvParams& p = b.common;
    p.n_in = gate.n_in;
    p.n_blocks = gate.layout.n_blocks;
    p.x = x;
    const DeviceWeight* ws[2] = {&gate, &up};
    for (int i = 0; i < 2; ++i) {
        b.w[i] = ws[i]->base;
        b.meta[i] = ws[i]->base + ws[i]->layout.meta_off;
        b.meta2[i] = ws[i]->base + ws[i]->layout.meta2_off;
        b.n_out[i] = ws[i]->n_out;
    }
    p.units = row_units(gate);
    b.wpr = warps_per_row(p.units);
    const int rows_per_cta = kRowsPerBlock / b.wpr;
    const unsigned n_ctas = unsigned((gate.n_out + rows_per_cta - 1) / rows_per_cta);
    switch (gate.type) {
        case GGMLType::F32: launch_swiglu<FmtFloat<float>>(b, out, n_ctas, n_tok, s); break;
        case GGMLType::F16: launch_swiglu<FmtFloat<__half>>(b, out, n_ctas, n_tok, s); break;
        case GGMLType::BF16: launch_swiglu<FmtFloat<__nv_bfloat16>>(b, out, n_ctas, n_tok, s); break;
        default: fail("cuda gemv_swiglu: unsupported weight type ", block_info(gate.type).name);
    }
}

namespace {

void gemv_batch(const DeviceWeight* const* ws, float* const* ys, int count, const float* x, const int8_t* xq,
                const float2* xds, int32_t n_tok, const QkvRopeStore* rope, cudaStream_t s) {
    if (count < 1 || count > kMaxGemvBatch)
        fail("cuda gemv: ", count, " weights in one launch (1..", kMaxGemvBatch, ")");
    const DeviceWeight& w0 = *ws[0];
    GemvBatch b{};
    GemvParams& p = b.common;
    p.n_in = w0.n_in;
    p.n_blocks = w0.layout.n_blocks;
    p.x = x;
    p.xq = xq;
    p.xds = xds;
    p.units = row_units(w0);
    b.wpr = warps_per_row(p.units);
    if (rope) b.rope = *rope;
    const int rows_per_cta = kRowsPerBlock / b.wpr;
    const bool cpu_order = gemv_cpu_order(w0.n_in);   // read by the legacy formats only
    unsigned n_ctas = 0;
    for (int i = 0; i < kMaxGemvBatch; ++i) {
        b.start[i] = int32_t(n_ctas);
        if (i >= count) {
            b.start[i] = 0x7fffffff;
            continue;
        }
        const DeviceWeight& w = *ws[i];
        if (w.type != w0.type || w.n_in != w0.n_in) fail("cuda gemv: batched weights differ in type or width");
        b.w[i] = w.base;
        b.meta[i] = w.base + w.layout.meta_off;
        b.meta2[i] = w.base + w.layout.meta2_off;
        b.y[i] = ys[i];
        b.n_out[i] = w.n_out;
        n_ctas += unsigned((w.n_out + rows_per_cta - 1) / rows_per_cta);
    }
    switch (w0.type) {
        case GGMLType::Q4_0: launch_legacy<DecodeQ4_0>(cpu_order, b, n_ctas, n_tok, s); break;
        case GGMLType::Q4_1: launch_legacy<DecodeQ4_1>(cpu_order, b, n_ctas, n_tok, s); break;
        case GGMLType::Q5_0: launch_legacy<DecodeQ5_0>(cpu_order, b, n_ctas, n_tok, s); break;
        case GGMLType::Q5_1: launch_legacy<DecodeQ5_1>(cpu_order, b, n_ctas, n_tok, s); break;
        case GGMLType::Q8_0: launch_legacy<DecodeQ8_0>(cpu_order, b, n_ctas, n_tok, s); break;
        case GGMLType::Q2_K: launch<FmtQ2_K>(b, n_ctas, n_tok, s); break;
        case GGMLType::Q3_K: launch<FmtQ3_K>(b, n_ctas, n_tok, s); break;
        case GGMLType::Q4_K: launch<FmtQK<false>>(b, n_ctas, n_tok, s); break;
        case GGMLType::Q5_K: launch<FmtQK<true>>(b, n_ctas, n_tok, s); break;
        case GGMLType::Q6_K: launch<FmtQ6_K>(b, n_ctas, n_tok, s); break;
        case GGMLType::MXFP4: launch_legacy<DecodeMXFP4>(cpu_order, b, n_ctas, n_tok, s); break;
        case GGMLType::IQ4_NL: launch_legacy<DecodeIQ4_NL>(cpu_order, b, n_ctas, n_tok, s); break;
        case GGMLType::IQ4_XS: launch<FmtIQ4_XS>(b, n_ctas, n_tok, s); break;
        case GGMLType::IQ3_S: launch<FmtIQ3_S>(b, n_ctas, n_tok, s); break;
        case GGMLType::IQ3_XXS: launch<FmtIQ3_XXS>(b, n_ctas, n_tok, s); break;
        case GGMLType::IQ2_XXS: launch<FmtIQ2_XXS>(b, n_ctas, n_tok, s); break;
        case GGMLType::IQ2_XS: launch<FmtIQ2_XS>(b, n_ctas, n_tok, s); break;
        case GGMLType::IQ2_S: launch<FmtIQ2_S>(b, n_ctas, n_tok, s); break;
        case GGMLType::IQ1_S: launch<FmtIQ1_S>(b, n_ctas, n_tok, s); break;
        case GGMLType::IQ1_M: launch<FmtIQ1_M>(b, n_ctas, n_tok, s); break;
        case GGMLType::TQ1_0: launch<FmtTQ1_0>(b, n_ctas, n_tok, s); break;
        case GGMLType::TQ2_0: launch<FmtTQ2_0>(b, n_ctas, n_tok, s); break;
        case GGMLType::NVFP4: launch<FmtNVFP4>(b, n_ctas, n_tok, s); break;
        case GGMLType::F32: launch<FmtFloat<float>>(b, n_ctas, n_tok, s); break;
        case GGMLType::F16: launch<FmtFloat<__half>>(b, n_ctas, n_tok, s); break;
        case GGMLType::BF16: launch<FmtFloat<__nv_bfloat16>>(b, n_ctas, n_tok, s); break;
        default: fail("cuda gemv: unsupported weight type ", block_info(w0.type).name);
    }
}

}  // namespace

void gemv(const DeviceWeight* const* ws, float* const* ys, int count, const float* x, const int8_t* xq,
          const float2* xds, int32_t n_tok, cudaStream_t s) {
    gemv_batch(ws, ys, count, x, xq, xds, n_tok, nullptr, s);
}

bool gemv_takes_rope_store(const DeviceWeight& q, const DeviceWeight& k, const DeviceWeight& v, int32_t head_dim) {
    const bool same = q.type == k.type && k.type == v.type && q.n_in == k.n_in && k.n_in == v.n_in &&
                      k.n_out == v.n_out;
    const bool whole_ctas = q.n_out % kRowsPerBlock == 0 && k.n_out % kRowsPerBlock == 0;
    return same && whole_ctas && head_dim % 2 == 0 && q.n_out % head_dim == 0 && k.n_out % head_dim == 0 &&
           warps_per_row(row_units(q)) == 1;
}

void gemv_rope_store(const DeviceWeight* const* ws, float* const* ys, const float* x, const int8_t* xq,
                     const float2* xds, int32_t n_tok, const QkvRopeStore& rope, cudaStream_t s) {
    if (!gemv_takes_rope_store(*ws[0], *ws[1], *ws[2], rope.head_dim) || !rope.cos_sin)
        fail("cuda gemv_rope_store: q, k, v do not take the fused rope and KV store");
    gemv_batch(ws, ys, 3, x, xq, xds, n_tok, &rope, s);
}

}  // namespace cuda
}  // namespace ember
