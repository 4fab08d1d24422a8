// Paged attention on the CPU. KV rows are f16 in blocks of block_size tokens; each (token, head)
// pair walks its sequence's block table up to its own position (causal).
// Precision follows llama.cpp's CPU attention (the reference our outputs are checked against):
// q is rounded to f16 for the q.k dot with f16 keys, the softmax runs in f32, and the
// probabilities are rounded to f16 before the dot with f16 values (f32 accumulation).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_backend.h"
#include "quant/half.h"

namespace ember {

namespace {
inline uint16_t* kv_row(const KVLayer& kv, void* base, int32_t block, int32_t slot) {
    const int64_t width = (int64_t)kv.n_head_kv * kv.head_dim;
    return static_cast<uint16_t*>(base) + ((int64_t)block * kv.block_size + slot) * width;
}

inline float round_f16(float x) { return half_to_float(float_to_half(x)); }
}  // namespace

void CpuBackend::kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
    const int64_t width = (int64_t)kv.n_head_kv * kv.head_dim;
    for (int32_t t = 0; t < n_tok; ++t) {
        const int32_t pos = batch_.pos[t];
        const int32_t block = batch_.block_table[(int64_t)batch_.seq[t] * batch_.max_blocks + pos / kv.block_size];
        const int32_t slot = pos % kv.block_size;
        uint16_t* kr = kv_row(kv, kv.k, block, slot);
        uint16_t* vr = kv_row(kv, kv.v, block, slot);
        for (int64_t i = 0; i < width; ++i) {
            kr[i] = float_to_half(k[t * width + i]);
            vr[i] = float_to_half(v[t * width + i]);
        }
    }
}

void CpuBackend::attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& s,
                           float* out) {
    const int32_t group = s.n_head / s.n_head_kv;
    const int64_t q_width = (int64_t)s.n_head * s.head_dim;
    const int32_t D = s.head_dim;
    pool_.parallel_for((int64_t)n_tok * s.n_head, 1, [&](int64_t b, int64_t e) {
        std::vector<float> qh(D), vf(D), prob;
        for (int64_t th = b; th < e; ++th) {
            const int32_t t = (int32_t)(th / s.n_head), h = (int32_t)(th % s.n_head);
            const int32_t kvh = h / group;
            const int32_t n_pos = batch_.pos[t] + 1;
            const int32_t* table = &batch_.block_table[(int64_t)batch_.seq[t] * batch_.max_blocks];
            for (int32_t i = 0; i < D; ++i) qh[i] = round_f16(q[t * q_width + (int64_t)h * D + i]);
            prob.resize(n_pos);
            float m = -INFINITY;
            for (int32_t p = 0; p < n_pos; ++p) {
                const uint16_t* kr = kv_row(kv, kv.k, table[p / kv.block_size], p % kv.block_size) + (int64_t)kvh * D;
                float d = 0.f;
                for (int32_t i = 0; i < D; ++i) d += qh[i] * half_to_float(kr[i]);
                prob[p] = d * s.scale;
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
                const float w = round_f16(prob[p] * inv);
                const uint16_t* vr = kv_row(kv, kv.v, table[p / kv.block_size], p % kv.block_size) + (int64_t)kvh * D;
                for (int32_t i = 0; i < D; ++i) o[i] += w * half_to_float(vr[i]);
            }
        }
    });
}

}  // namespace ember
