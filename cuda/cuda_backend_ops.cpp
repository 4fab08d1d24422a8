// The CUDA backend's element-wise primitives and the fused ops of a block. Where a GEMV of a
// decode-sized batch reads the result of the kernel before it, that kernel also writes the result
// as q8_1 blocks into the scratch (xq_, xds_) and the GEMV reads them there: the handoff is explicit
// inside one op.
#include <cuda_runtime.h>

#include "cuda_backend_impl.h"
#include "delta_rule.h"
#include "rmsnorm_grouped.h"
#include "short_conv.h"
#include "ssm_scan.h"

namespace ember {
namespace cuda {

void CudaBackend::rmsnorm(const float* x, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y) {
    issue_uploads();
    cuda::rmsnorm(const_cast<float*>(x), nullptr, gamma, n_tok, dim, eps, y, nullptr, nullptr, stream_);
}

void CudaBackend::head_rmsnorm(float* x, const float* gamma, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                               float eps) {
    issue_uploads();
    cuda::head_rmsnorm(x, gamma, n_tok, n_heads, head_dim, eps, stream_);
}

void CudaBackend::rmsnorm_grouped(const float* x, const float* gamma, int32_t n_rows, int64_t width, int32_t n_groups,
                                  float eps, float* y) {
    issue_uploads();
    cuda::rmsnorm_grouped(x, gamma, n_rows, width, n_groups, eps, y, stream_);
}

void CudaBackend::rope(float* x, int32_t n_tok, int32_t n_heads, const RopeParams& rope) {
    issue_uploads();
    check_batch(n_tok, "rope");
    cuda::rope(x, dbatch_.pos, n_tok, n_heads, rope.head_dim, rope.rotated(), rope_table(rope), rope.neox, stream_);
}

void CudaBackend::attn_temperature(float* q, int32_t n_tok, int64_t width, const RopeParams& rope) {
    issue_uploads();
    check_batch(n_tok, "attn_temperature");
    if (rope.temp_scale == 0.0f) return;
    cuda::attn_temperature(q, dbatch_.pos, n_tok, width, rope.temp_scale, rope.temp_length, rope.temp_offset, stream_);
}

void CudaBackend::gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out) {
    issue_uploads();
    cuda::gated_act(act, gate, up, n, out, stream_);
}

void CudaBackend::add(float* x, const float* y, int64_t n) {
    issue_uploads();
    cuda::add(x, y, n, stream_);
}

void CudaBackend::add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim) {
    issue_uploads();
    cuda::add_bias(x, bias, n_tok, dim, stream_);
}

void CudaBackend::scale_softcap(float* x, int64_t n, float scale, float cap) {
    issue_uploads();
    cuda::scale_softcap(x, n, scale, cap, stream_);
}

void CudaBackend::gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                   int32_t n_tok, const DeltaRuleShape& shape, float* state, float* out) {
    check_delta_rule_shape(shape, n_tok, "cuda gated_delta_rule");
    issue_uploads();
    cuda::gated_delta_rule(q, k, v, g, beta, n_tok, shape, state, out, stream_);
}

void CudaBackend::short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels,
                             int32_t kernel, bool silu, float* state, float* y) {
    check_short_conv(n_tok, channels, kernel, "cuda short_conv");
    issue_uploads();
    cuda::short_conv(x, w, bias, n_tok, channels, kernel, silu, state, y, stream_);
}

void CudaBackend::ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                           int32_t n_tok, const SsmShape& shape, float* state, float* y) {
    check_ssm_shape(shape, n_tok, "cuda ssm_scan");
    issue_uploads();
    cuda::ssm_scan(xbc, dt, A, dt_bias, D, n_tok, shape, state, y, stream_);
}

void CudaBackend::argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids) {
    issue_uploads();
    cuda::argmax_rows(x, n_rows, width, ids, stream_);
}

// The residual add inside the norm kernel.
void CudaBackend::add_rmsnorm(float* x, const float* residual, const float* gamma, int32_t n_tok, int32_t dim,
                              float eps, float* y) {
    if (!sw_.fuse) return Backend::add_rmsnorm(x, residual, gamma, n_tok, dim, eps, y);
    issue_uploads();
    norm(x, residual, gamma, n_tok, dim, eps, y, false);
}

// The output head: the norm writes the q8_1 input of the GEMV.
void CudaBackend::norm_matmul(float* x, const float* residual, const float* gamma, float eps, const Weight& w,
                              int32_t n_tok, float* xn, float* y) {
    if (!sw_.fuse) return Backend::norm_matmul(x, residual, gamma, eps, w, n_tok, xn, y);
    issue_uploads();
    const Weight* ws[1] = {&w};
    const int32_t dim = int32_t(w.n_in);
    const bool dq = feeds_dq(ws, n_tok), q8 = !dq && feeds_q8(ws, 1, n_tok, dim);
    norm(x, residual, gamma, n_tok, dim, eps, xn, q8, dq);
    project(ws, &y, 1, xn, n_tok, q8, dq);
}

// Norm (+ residual add, + q8_1 output); Q, K, V in one GEMV launch. A plain block (no biases, no
// q/k norms) with f16 caches and normal rope has the GEMV rotate q and k and store k and v as it
// writes its rows where qkv_may_take_rope_store and gemv_takes_rope_store; otherwise one kernel
// ropes q and k and stores f16 k and v (a q8_0 cache is stored by its own kernel after it; with one
// f16 and one q8_0 cache, each is), after the biases and the per-head norms.
void CudaBackend::attn_in(const AttnInWeights& w, float* x, const float* residual, int32_t n_tok, KVLayer& kv,
                          const BlockBuffers& b) {
    if (!sw_.fuse) return Backend::attn_in(w, x, residual, n_tok, kv, b);
    issue_uploads();
    check_batch(n_tok, "attn_in");
    check_kv(kv, "attn_in");
    if (!w.rope) return Backend::attn_in(w, x, residual, n_tok, kv, b);   // NoPE layers: nothing to fuse a rope into
    const RopeParams& rp = *w.rope;
    if (w.head_dim != kv.head_dim || w.n_head_kv != kv.n_head_kv || rp.head_dim != w.head_dim)
        fail("cuda attn_in: ", w.n_head_kv, " kv heads of ", w.head_dim, " (rope over ", rp.head_dim,
             ") do not match the KV layer (", kv.n_head_kv, " of ", kv.head_dim, ")");
    const int32_t dim = int32_t(w.wq->n_in);
    const Weight* ws[3] = {w.wq, w.wk, w.wv};
    float* ys[3] = {b.q, b.k, b.v};
    const bool dq = feeds_dq(ws, n_tok), q8 = !dq && feeds_q8(ws, 3, n_tok, dim);
    norm(x, residual, w.norm, n_tok, dim, w.eps, b.xn, q8, dq);
    const float2* table = rope_table(rp);
    const bool f16_cache = kv.k_type == GGMLType::F16 && kv.v_type == GGMLType::F16;
    // Partial rotary and the attention temperature take the separate kernels: the fused store
    // writes only the rotated pairs, and the GEMV's rope knows neither.
    const bool whole_rope = rp.rotated() == rp.head_dim && rp.temp_scale == 0.0f;
    const bool plain = !w.bq && !w.bk && !w.bv && !w.q_norm && !w.k_norm && whole_rope;
    if (qkv_may_take_rope_store(plain, f16_cache, rp.neox, matmul_query(*w.wq, n_tok))) {
        const DeviceWeight dwq = device_weight(*w.wq), dwk = device_weight(*w.wk), dwv = device_weight(*w.wv);
        if (gemv_takes_rope_store(dwq, dwk, dwv, kv.head_dim)) {
            const DeviceWeight* pw[3] = {&dwq, &dwk, &dwv};
            const QkvRopeStore e{
                table, static_cast<__half*>(kv.k), static_cast<__half*>(kv.v), kv.block_size, kv.head_dim, dbatch_};
            gemv_rope_store(pw, ys, b.xn, static_cast<const int8_t*>(xq_.p), static_cast<const float2*>(xds_.p), n_tok,
                            e, stream_);
            return;
        }
    }
    project(ws, ys, 3, b.xn, n_tok, q8, dq);
    const int32_t qw = w.n_head * w.head_dim, kw = w.n_head_kv * w.head_dim;
    if (w.bq) cuda::add_bias(b.q, w.bq, n_tok, qw, stream_);
    if (w.bk) cuda::add_bias(b.k, w.bk, n_tok, kw, stream_);
    if (w.bv) cuda::add_bias(b.v, w.bv, n_tok, kw, stream_);
    if (w.q_norm) cuda::head_rmsnorm(b.q, w.q_norm, n_tok, w.n_head, w.head_dim, w.eps, stream_);
    if (w.k_norm) cuda::head_rmsnorm(b.k, w.k_norm, n_tok, w.n_head_kv, w.head_dim, w.eps, stream_);
    // An early start only for the kernels attention_starts_early names (before the short-context
    // reference-order kernel an early start costs time).
    // (The layer's kv heads stand in for the q heads: those set only how many a CTA takes.)
    const AttentionShape shape{kv.n_head_kv, kv.n_head_kv, kv.head_dim, 0.f, 0};
    const bool early = attention_starts_early(attention_query(kv, shape, n_tok));
    const bool fused_store = f16_cache && rp.rotated() == rp.head_dim;
    cuda::rope_kv_store(b.q, w.n_head, b.k, b.v, kv.n_head_kv, kv.head_dim, rp.rotated(), table, rp.neox,
                        fused_store ? static_cast<__half*>(kv.k) : nullptr,
                        fused_store ? static_cast<__half*>(kv.v) : nullptr, kv.block_size, n_tok, dbatch_, early,
                        stream_);
    if (rp.temp_scale != 0.0f)
        cuda::attn_temperature(b.q, dbatch_.pos, n_tok, int64_t(w.n_head) * w.head_dim, rp.temp_scale, rp.temp_length,
                               rp.temp_offset, stream_);
    if (fused_store) return;
    if (kv.k_type == GGMLType::Q8_0 && kv.v_type == GGMLType::Q8_0) store_q8(kv, b.k, b.v, n_tok);
    else store_mixed(kv, b.k, b.v, n_tok);
}

// The attention kernels that can write their output as the q8_1 input of the O projection's GEMV
// do.
void CudaBackend::attn_out(const KVLayer& kv, const AttentionShape& shape, const Weight& wo, int32_t n_tok,
                           const BlockBuffers& b, float* out) {
    if (!sw_.fuse) return Backend::attn_out(kv, shape, wo, n_tok, b, out);
    issue_uploads();
    const Weight* ws[1] = {&wo};
    const int64_t width = int64_t(shape.n_head) * shape.head_dim;
    if (wo.n_in != width) fail("cuda attn_out: the O projection reads ", wo.n_in, " values, attention writes ", width);
    const bool q8 = attend(kv, b.q, n_tok, shape, b.att, shape.head_dim % 32 == 0 && feeds_q8(ws, 1, n_tok, width));
    project(ws, &out, 1, b.att, n_tok, q8);
}

// Norm (+ residual add, + q8_1 output); gate and up in one GEMV launch; the gated activation
// writing the q8_1 input of the down projection's GEMV. Float weights of decode batches with SiLU:
// gate, up and the activation are one GEMV (gemv_swiglu).
void CudaBackend::ffn(const FfnWeights& w, float* x, const float* residual, int32_t n_tok, const BlockBuffers& b,
                      float* out) {
    if (!sw_.fuse) return Backend::ffn(w, x, residual, n_tok, b, out);
    issue_uploads();
    const int32_t dim = int32_t(w.gate->n_in);
    const int64_t n_ff = w.gate->n_out, n = int64_t(n_tok) * n_ff;
    if (w.up->n_in != dim || w.up->n_out != n_ff || w.down->n_in != n_ff)
        fail("cuda ffn: gate ", w.gate->n_out, "x", w.gate->n_in, ", up ", w.up->n_out, "x", w.up->n_in, " and down ",
             w.down->n_out, "x", w.down->n_in, " do not chain");
    const Weight* gu[2] = {w.gate, w.up};
    const Weight* dn[1] = {w.down};
    if (ffn_takes_gemv_swiglu(w.act == Activation::SiLU, w.gate->type, w.up->type, batch_facts(n_tok))) {
        norm(x, residual, w.norm, n_tok, dim, w.eps, b.xn, false);
        gemv_swiglu(device_weight(*w.gate), device_weight(*w.up), b.gate, b.xn, n_tok, stream_);
        project(dn, &out, 1, b.gate, n_tok, false);
        return;
    }
    const bool dq_in = feeds_dq(gu, n_tok), q8_in = !dq_in && feeds_q8(gu, 2, n_tok, dim);
    norm(x, residual, w.norm, n_tok, dim, w.eps, b.xn, q8_in, dq_in);
    float* ys[2] = {b.gate, b.up};
    project(gu, ys, 2, b.xn, n_tok, q8_in, dq_in);
    if (feeds_dq(dn, n_tok) && n % 32 == 0) {
        cuda::gated_act_dq(w.act, b.gate, b.up, n, dq_scratch(n), stream_);
        project(dn, &out, 1, b.gate, n_tok, false, true);   // (b.gate itself is not written)
        return;
    }
    const bool q8_mid = feeds_q8(dn, 1, n_tok, n_ff);
    if (q8_mid) {
        const Q8 q = q8_scratch(n);
        cuda::gated_act_q8(w.act, b.gate, b.up, n, b.gate, q.q, q.ds, stream_);
    } else {
        cuda::gated_act(w.act, b.gate, b.up, n, b.gate, stream_);
    }
    project(dn, &out, 1, b.gate, n_tok, q8_mid);
}

}  // namespace cuda
}  // namespace ember
