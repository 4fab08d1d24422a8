// The CUDA backend's mixture-of-experts: the primitives of the default composition, and the moe op
// itself on the device with no host synchronisation (so decode steps stay graphs): the router's
// GEMV, routing, then the one-token path or the grouped path that choose_moe names. Beside them the
// small elementwise ops and row copies of the hybrid models' glue (mul, softplus_gate, copy_rows).
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_backend_impl.h"
#include "cuda_check.h"

namespace ember {
namespace cuda {

// The op's scratch in moe_, laid out per call (256-byte aligned regions); null where the path does
// not use a region.
struct CudaBackend::MoeBuffers {
    float* logits = nullptr;
    int32_t* ids = nullptr;
    float* weights = nullptr;
    MoeChunk* chunks = nullptr;
    int32_t n_chunks = 0;
    int32_t *sorted = nullptr, *pos = nullptr;
    int8_t* xq = nullptr;   // xn as q8_1, where no kernel before made it
    float2* xds = nullptr;
    float* xg = nullptr;    // grouped: the inputs in expert order, float or q8_1 (xgq, xgds)
    int8_t* xgq = nullptr;
    float2* xgds = nullptr;
    float* h = nullptr;     // act(gate) * up of every row
    int8_t* hq = nullptr;
    float2* hds = nullptr;
    float* y = nullptr;     // grouped: the weighted down rows in expert order
    float *sg = nullptr, *su = nullptr, *sy = nullptr, *slogit = nullptr;   // the shared expert
};

namespace {

MoeRouteArgs route_args(const MoeWeights& w, const float* logits, const float* bias, int32_t n_tok, bool ascending,
                        int32_t* ids, float* weights, MoeChunk* chunks) {
    MoeRouteArgs a;
    a.n_group = w.n_group;
    a.n_group_used = w.n_group_used;
    a.logits = logits;
    a.router_bias = bias;
    a.selection_bias = w.selection_bias;
    a.n_tok = n_tok;
    a.n_expert = w.n_expert;
    a.n_used = w.n_used;
    a.gating = w.gating;
    a.norm_topk = w.norm_topk;
    a.ascending = ascending;
    a.weight_scale = w.weight_scale;
    a.ids = ids;
    a.weights = weights;
    a.chunks = chunks;
    return a;
}

}  // namespace

void CudaBackend::moe_route(const MoeWeights& w, const float* logits, int32_t n_tok, int32_t* ids, float* weights) {
    issue_uploads();
    cuda::moe_route(route_args(w, logits, nullptr, n_tok, false, ids, weights, nullptr), stream_);
}

void CudaBackend::gather_rows(const float* x, const int32_t* rows, int32_t n_rows, int64_t dim, float* y) {
    issue_uploads();
    gather_rows_bytes(x, dim * int64_t(sizeof(float)), rows, 1, n_rows, y, stream_);
}

void CudaBackend::scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* scale, int32_t n_rows,
                                   int64_t dim) {
    issue_uploads();
    cuda::scatter_add_rows(out, y, rows, scale, n_rows, dim, stream_);
}

void CudaBackend::sigmoid(float* x, int64_t n) {
    issue_uploads();
    cuda::sigmoid(x, n, stream_);
}

void CudaBackend::mul(float* x, const float* y, int64_t n) {
    issue_uploads();
    cuda::mul(x, y, n, stream_);
}

void CudaBackend::softplus_gate(float* x, const float* bias, const float* scale, int32_t n_tok, int32_t dim) {
    issue_uploads();
    cuda::softplus_gate(x, bias, scale, n_tok, dim, stream_);
}

// One strided copy on the stream (a memcpy node in a captured step).
void CudaBackend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                            int64_t n_rows) {
    if (width < 0 || n_rows < 0 || (n_rows > 1 && (dst_stride < width || src_stride < width)))
        fail("cuda copy_rows: width ", width, " and n_rows ", n_rows, " must be >= 0 and the strides (", dst_stride,
             ", ", src_stride, ") at least the width");
    if (width == 0 || n_rows == 0) return;
    issue_uploads();
    const size_t f = sizeof(float);
    EMBER_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(n_rows > 1 ? dst_stride : width) * f, src,
                                       size_t(n_rows > 1 ? src_stride : width) * f, size_t(width) * f, size_t(n_rows),
                                       cudaMemcpyDeviceToDevice, stream_));
}

namespace {

void check_moe(const MoeWeights& w) {
    if (!w.router || !w.gate || !w.up || !w.down)
        fail("cuda moe: the router and the gate, up and down experts are needed");
    const int64_t n_embd = w.router->n_in, n_ff = w.gate->n_out;
    if (w.router->n_out != w.n_expert)
        fail("cuda moe: the router scores ", w.router->n_out, " experts, the block has ", w.n_expert);
    for (const Weight* e : {w.gate, w.up, w.down})
        if (e->n_expert != w.n_expert)
            fail("cuda moe: an expert tensor stacks ", e->n_expert, " experts, the router scores ", w.n_expert);
    if (w.gate->n_in != n_embd || w.up->n_in != n_embd || w.up->n_out != n_ff || w.down->n_in != n_ff ||
        w.down->n_out != n_embd)
        fail("cuda moe: gate ", w.gate->n_out, "x", w.gate->n_in, ", up ", w.up->n_out, "x", w.up->n_in, " and down ",
             w.down->n_out, "x", w.down->n_in, " do not chain from and to ", n_embd, " values");
    if (!w.shared_gate) return;
    if (!w.shared_up || !w.shared_down || w.shared_gate->n_in != n_embd || w.shared_up->n_in != n_embd ||
        w.shared_up->n_out != w.shared_gate->n_out || w.shared_down->n_in != w.shared_gate->n_out ||
        w.shared_down->n_out != n_embd)
        fail("cuda moe: the shared expert's gate, up and down do not chain from and to ", n_embd, " values");
    if (w.shared_gate_inp && (w.shared_gate_inp->n_in != n_embd || w.shared_gate_inp->n_out != 1))
        fail("cuda moe: the shared expert's gate input is ", w.shared_gate_inp->n_out, "x", w.shared_gate_inp->n_in,
             ", not 1x", n_embd);
}

// Bump allocation of 256-byte-aligned regions from base (null: only counts the bytes).
struct Carve {
    char* base;
    size_t used = 0;
    template <class T>
    T* take(int64_t n) {
        T* p = base ? reinterpret_cast<T*>(base + used) : nullptr;
        used += (size_t(std::max<int64_t>(n, 0)) * sizeof(T) + 255) / 256 * 256;
        return p;
    }
};

}  // namespace

MoeQuery CudaBackend::moe_query(const MoeWeights& w, int32_t n_tok) const {
    MoeQuery q;
    q.gate = w.gate->type;
    q.up = w.up->type;
    q.down = w.down->type;
    q.n_embd = w.router->n_in;
    q.n_ff = w.gate->n_out;
    q.n_expert = w.n_expert;
    q.n_used = w.n_used;
    q.batch = batch_facts(n_tok);
    q.sw = sw_;
    return q;
}

MoeExperts CudaBackend::moe_experts(const Weight& w) const {
    return {w.type,          static_cast<const uint8_t*>(w.data),
            w.expert_stride, packed_layout(w.type, w.n_in, w.n_out),
            w.n_in,          w.n_out};
}

CudaBackend::MoeBuffers CudaBackend::moe_buffers(const MoeWeights& w, int32_t n_tok, MoeKernel k) {
    const int64_t n_embd = w.router->n_in, n_ff = w.gate->n_out, n_exp = w.n_expert;
    const int64_t rows = int64_t(n_tok) * w.n_used;
    const bool grouped = k == MoeKernel::grouped;
    // Grouped chunks read kMaxGemvTokens rows from their first: the expert-ordered buffers hold that
    // many rows past the last.
    const int64_t held = grouped ? rows + kMaxGemvTokens : rows;
    const int64_t n_chunks = grouped ? rows / kMaxGemvTokens + std::min(n_exp, rows) + 1 : rows;
    const bool q8_in = gemv_wants_q8(w.gate->type), q8_mid = gemv_wants_q8(w.down->type);
    const int64_t n_ffs = w.shared_gate ? w.shared_gate->n_out : 0;
    auto lay = [&](char* base) {
        Carve c{base};
        MoeBuffers m;
        m.logits = c.take<float>(n_tok * n_exp);
        m.ids = c.take<int32_t>(rows);
        m.weights = c.take<float>(rows);
        m.chunks = c.take<MoeChunk>(n_chunks);
        m.n_chunks = int32_t(n_chunks);
        if (q8_in) {
            m.xq = c.take<int8_t>(n_tok * n_embd);
            m.xds = c.take<float2>(n_tok * n_embd / 32);
        }
        if (grouped) {
            m.sorted = c.take<int32_t>(rows);
            m.pos = c.take<int32_t>(rows);
            if (q8_in) {
                m.xgq = c.take<int8_t>(held * n_embd);
                m.xgds = c.take<float2>(held * n_embd / 32);
            } else {
                m.xg = c.take<float>(held * n_embd);
            }
            m.y = c.take<float>(rows * n_embd);
        }
        m.h = c.take<float>(held * n_ff);
        if (q8_mid) {
            m.hq = c.take<int8_t>(held * n_ff);
            m.hds = c.take<float2>(held * n_ff / 32);
        }
        if (n_ffs) {
            m.sg = c.take<float>(n_tok * n_ffs);
            m.su = c.take<float>(n_tok * n_ffs);
            m.sy = c.take<float>(n_tok * n_embd);
            m.slogit = c.take<float>(n_tok);
        }
        return std::make_pair(m, c.used);
    };
    ensure(moe_, lay(nullptr).second);
    return lay(static_cast<char*>(moe_.p)).first;
}

void CudaBackend::moe(const MoeWeights& w, const float* xn, int32_t n_tok, const BlockBuffers& b, float* out) {
    if (n_tok <= 0) return;
    check_moe(w);
    const MoeKernel k = choose_moe(moe_query(w, n_tok));
    // The kernels weight the experts' outputs; weights on the inputs (llama 4) take the composition.
    if (k == MoeKernel::composed || w.weight_input) return Backend::moe(w, xn, n_tok, b, out);
    issue_uploads();
    run_moe(w, xn, n_tok, k, false, out);
}

// The norm writes xn's q8_1 blocks where the experts read them, as ffn's norm does for its GEMV.
void CudaBackend::moe_ffn(const MoeWeights& w, float* x, const float* residual, int32_t n_tok, const BlockBuffers& b,
                          float* out) {
    if (n_tok <= 0) return;
    check_moe(w);
    const MoeKernel k = choose_moe(moe_query(w, n_tok));
    if (k == MoeKernel::composed || w.weight_input) return Backend::moe_ffn(w, x, residual, n_tok, b, out);
    issue_uploads();
    const int32_t dim = int32_t(w.router->n_in);
    const bool q8 = gemv_wants_q8(w.gate->type) && dim % 32 == 0;
    norm(x, residual, w.norm, n_tok, dim, w.eps, b.xn, q8);
    run_moe(w, b.xn, n_tok, k, q8, out);
}

// The shared expert through the matmul dispatch (it is a plain gated feed-forward) into m.sy, and
// its gate's logit into m.slogit.
void CudaBackend::shared_expert(const MoeWeights& w, const float* xn, int32_t n_tok, const MoeBuffers& m) {
    const Weight* gu[2] = {w.shared_gate, w.shared_up};
    float* ys[2] = {m.sg, m.su};
    project(gu, ys, 2, xn, n_tok, false);
    cuda::gated_act(w.act, m.sg, m.su, int64_t(n_tok) * w.shared_gate->n_out, m.sg, stream_);
    const Weight* dn[1] = {w.shared_down};
    project(dn, &m.sy, 1, m.sg, n_tok, false);
    if (w.shared_gate_inp) {
        const Weight* gi[1] = {w.shared_gate_inp};
        project(gi, &m.slogit, 1, xn, n_tok, false);
    }
}

// xn_q8: the scratch's q8_1 blocks (xq_, xds_) hold xn. The routed experts' gate and up read them
// before the shared expert's matmuls reuse that scratch.
void CudaBackend::run_moe(const MoeWeights& w, const float* xn, int32_t n_tok, MoeKernel k, bool xn_q8, float* out) {
    const MoeBuffers m = moe_buffers(w, n_tok, k);
    const int64_t n_embd = w.router->n_in, n_ff = w.gate->n_out;
    const int32_t rows = n_tok * w.n_used;
    const bool pairs = k == MoeKernel::pairs;

    const Weight* router[1] = {w.router};
    project(router, &m.logits, 1, xn, n_tok, xn_q8);
    const bool router_q8 = matmul_reads_q8(matmul_query(*w.router, n_tok)) && n_embd % 32 == 0;
    cuda::moe_route(route_args(w, m.logits, w.router_bias, n_tok, true, m.ids, m.weights, pairs ? m.chunks : nullptr),
                    stream_);

    // xn as the gate and up kernels read it
    const bool q8_in = gemv_wants_q8(w.gate->type);
    const int8_t* xq = static_cast<const int8_t*>(xq_.p);
    const float2* xds = static_cast<const float2*>(xds_.p);
    if (q8_in && !xn_q8 && !router_q8) {
        quantize_q8_1(xn, m.xq, m.xds, n_tok, n_embd, stream_);
        xq = m.xq;
        xds = m.xds;
    }
    MoeUpArgs up{moe_experts(*w.gate), moe_experts(*w.up), w.gate_bias, w.up_bias, m.chunks, xn, xq, xds, m.h, w.act};
    if (pairs) {
        moe_up(up, m.n_chunks, 1, stream_);
    } else {
        moe_group(m.ids, rows, w.n_expert, kMaxGemvTokens, m.sorted, m.pos, m.chunks, m.n_chunks, stream_);
        if (q8_in) {
            gather_rows_bytes(xq, n_embd, m.sorted, w.n_used, rows, m.xgq, stream_);
            gather_rows_bytes(xds, n_embd / 32 * int64_t(sizeof(float2)), m.sorted, w.n_used, rows, m.xgds, stream_);
        } else {
            gather_rows_bytes(xn, n_embd * int64_t(sizeof(float)), m.sorted, w.n_used, rows, m.xg, stream_);
        }
        up.x = m.xg;
        up.xq = m.xgq;
        up.xds = m.xgds;
        moe_up(up, m.n_chunks, kMaxGemvTokens, stream_);
    }
    if (w.shared_gate) shared_expert(w, xn, n_tok, m);
    if (m.hq) quantize_q8_1(m.h, m.hq, m.hds, rows, n_ff, stream_);
    const float* shared = w.shared_gate ? m.sy : nullptr;
    const float* shared_logit = w.shared_gate_inp ? m.slogit : nullptr;
    if (pairs) {
        const MoeDownSumArgs d{moe_experts(*w.down), w.down_bias, m.ids, m.weights, w.n_used, m.h, m.hq, m.hds, shared,
                               shared_logit,         out};
        moe_down_sum(d, n_tok, stream_);
        return;
    }
    const MoeDownArgs d{moe_experts(*w.down), w.down_bias, m.chunks, m.h, m.hq, m.hds, m.sorted, m.weights, m.y};
    moe_down(d, m.n_chunks, kMaxGemvTokens, stream_);
    moe_combine(m.y, m.pos, n_tok, w.n_used, n_embd, shared, shared_logit, out, stream_);
}

}  // namespace cuda
}  // namespace ember
