// Paged attention on the CPU. KV rows live in blocks of block_size tokens; each (token, head)
// pair walks its sequence's block table up to its own position (causal).
// f16 KV follows llama.cpp's CPU attention precision (the reference our outputs are checked
// against): q is rounded to f16 for the q.k dot with f16 keys, the softmax runs in f32, and the
// probabilities are rounded to f16 before the dot with f16 values (f32 accumulation).
// f32 KV keeps everything in f32 (exact comparisons with other implementations).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/f16_ops.h"
#include "quant/half.h"

namespace ember {

namespace {

struct F16Kv {
    using elem = uint16_t;
    static elem store(float x) { return float_to_half(x); }
    static float operand(float x) { return half_to_float(float_to_half(x)); }   // rounded like the kv
    static float dot(const float* a, const elem* b, int n) { return f16_dot(a, b, n); }
    static void axpy(float w, const elem* x, float* y, int n) { f16_axpy(w, x, y, n); }
};

struct F32Kv {
    using elem = float;
    static elem store(float x) { return x; }
    static float operand(float x) { return x; }
    static float dot(const float* a, const elem* b, int n) {
        float d = 0.f;
        for (int i = 0; i < n; ++i) d += a[i] * b[i];
        return d;
    }
    static void axpy(float w, const elem* x, float* y, int n) {
        for (int i = 0; i < n; ++i) y[i] += w * x[i];
    }
};

template <class Kv>
typename Kv::elem* kv_row(const KVLayer& kv, void* base, int32_t block, int32_t slot) {
    const int64_t width = (int64_t)kv.n_head_kv * kv.head_dim;
    return static_cast<typename Kv::elem*>(base) + ((int64_t)block * kv.block_size + slot) * width;
}

template <class Kv>
void store_rows(const BatchInfo& batch, KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
    const int64_t width = (int64_t)kv.n_head_kv * kv.head_dim;
    for (int32_t t = 0; t < n_tok; ++t) {
        const int32_t pos = batch.pos[t];
        const int32_t block = batch.block_table[(int64_t)batch.seq[t] * batch.max_blocks + pos / kv.block_size];
        auto* kr = kv_row<Kv>(kv, kv.k, block, pos % kv.block_size);
        auto* vr = kv_row<Kv>(kv, kv.v, block, pos % kv.block_size);
        for (int64_t i = 0; i < width; ++i) {
            kr[i] = Kv::store(k[t * width + i]);
            vr[i] = Kv::store(v[t * width + i]);
        }
    }
}

template <class Kv>
void attend(ThreadPool& pool, const BatchInfo& batch, const KVLayer& kv, const float* q, int32_t n_tok,
            const AttentionShape& s, float* out) {
    const int32_t group = s.n_head / s.n_head_kv;
    const int64_t q_width = (int64_t)s.n_head * s.head_dim;
    const int32_t D = s.head_dim;
    pool.parallel_for((int64_t)n_tok * s.n_head, 1, [&](int64_t b, int64_t e) {
        std::vector<float> qh(D), prob;
        for (int64_t th = b; th < e; ++th) {
            const int32_t t = (int32_t)(th / s.n_head), h = (int32_t)(th % s.n_head);
            const int64_t kv_off = (int64_t)(h / group) * D;
            const int32_t n_pos = batch.pos[t] + 1;
            const int32_t* table = &batch.block_table[(int64_t)batch.seq[t] * batch.max_blocks];
            for (int32_t i = 0; i < D; ++i) qh[i] = Kv::operand(q[t * q_width + (int64_t)h * D + i]);
            prob.resize(n_pos);
            float m = -INFINITY;
            for (int32_t p = 0; p < n_pos; ++p) {
                const auto* kr = kv_row<Kv>(kv, kv.k, table[p / kv.block_size], p % kv.block_size) + kv_off;
                prob[p] = Kv::dot(qh.data(), kr, D) * s.scale;
                m = std::max(m, prob[p]);
            }
            double sum = 0.0;
            for (int32_t p = 0; p < n_pos; ++p) {
                prob[p] = std::exp(prob[p] - m);
                sum += prob[p];
            }
            const float inv = (float)(1.0 / sum);
            float* o = out + t * q_width + (int64_t)h * D;
            std::fill(o, o + D, 0.f);
            for (int32_t p = 0; p < n_pos; ++p) {
                const float w = Kv::operand(prob[p] * inv);
                const auto* vr = kv_row<Kv>(kv, kv.v, table[p / kv.block_size], p % kv.block_size) + kv_off;
                Kv::axpy(w, vr, o, D);
            }
        }
    });
}

}  // namespace

void CpuBackend::kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
    if (kv.type == GGMLType::F32) store_rows<F32Kv>(batch_, kv, k, v, n_tok);
    else store_rows<F16Kv>(batch_, kv, k, v, n_tok);
}

void CpuBackend::attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& s,
                           float* out) {
    if (kv.type == GGMLType::F32) attend<F32Kv>(pool_, batch_, kv, q, n_tok, s, out);
    else attend<F16Kv>(pool_, batch_, kv, q, n_tok, s, out);
}

}  // namespace ember
