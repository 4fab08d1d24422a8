// Paged attention on the CPU. KV rows live in blocks of block_size tokens; each token attends to
// positions 0..pos of its sequence (causal), or the last `window` of them (sliding window), or
// those of its own chunk (chunked attention), walking the sequence's block table.
//
// Work unit: (sequence, kv head, run of up to 32 of its tokens). A unit first gathers the keys it
// needs from the paged cache into f32 scratch, transposed in groups of 16 positions so that 16 q.k
// dots advance side by side in SIMD lanes, and then serves every query head that reads this kv head
// (GQA) for each of its tokens. f16 values are read where they lie, each row once per token for all
// of the group's heads (weighted_sum_f16); values of the other types are gathered as f32 rows.
//
// Precision: f16 KV follows llama.cpp's CPU attention (our outputs are checked against it token
// by token): q rounded to f16 for the q.k dot, softmax in f32, probabilities rounded to f16 before
// the dot with the values. Each dot is a sequential sum over the head dimension and each output
// element a sequential sum over positions, exactly as a scalar loop would do it: a reordered sum
// flips 8-bit activation rounding downstream and costs agreement with llama.cpp. The dots and
// sums run in attention_math.h, whose SIMD levels keep that order.
// f32 KV keeps everything in f32 (exact comparisons with other implementations).
// q8_0 KV (layout in src/backend/kv_layout.h): rows are stored as ggml's quantize_row_q8_0 would
// and the gather dequantizes them (scale * int8); q and the probabilities stay f32, since the
// int8 rounding of K and V dominates the error (llama.cpp's CPU path quantizes q to q8_0 too, so
// outputs are close to it, not equal).
// q4_0, q4_1, q5_0 and q5_1 KV (rows of ggml's blocks) are stored by ember's scalar quantizers
// (ggml's rounding) and read as f32 rows, as q8_0's are.
// bf16 KV (llama.cpp's -ctk / -ctv bf16) is read as f32 rows, like f32 KV: q and the probabilities
// stay f32 (llama.cpp rounds q to bf16 for its K.Q dot, so outputs are close to it, not equal).
// K and V may have different types: q is rounded as K's type asks (it meets the keys), the
// probabilities as V's (they meet the values).
// Sinks (AttentionShape::sinks) enter each head's softmax as llama.cpp's CPU attention adds them:
// the max and the denominator, in f32 and unscaled.
// Soft-capping (AttentionShape::softcap) maps each scaled score through softcap_score, whose tanh is
// built from expf so that CUDA's reference-order kernel (its glibc expf) gives the same bits.
#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "cpu/attention_math.h"
#include "cpu/cpu_backend.h"
#include "backend/kv_layout.h"
#include "ember/status.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/kernels.h"

namespace ember {

namespace {

constexpr int kLanes = kAttentionLanes;   // positions per transposed key group
constexpr int kTokensPerUnit = 32;

int64_t kv_width(const KVLayer& kv) { return (int64_t)kv.n_head_kv * kv.head_dim; }

// cap * tanh(s / cap), tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2 |x|): no overflow for any
// score, and the same f32 steps as cuda/attention_exact.cu's softcap_score.
float softcap_score(float s, float cap) {
    const float x = s / cap;
    const float e = std::exp(-2.0f * std::fabs(x));
    return std::copysign(cap * ((1.0f - e) / (1.0f + e)), x);
}

// Asks for the cache lines of [p, p + bytes) ahead of their use.
void prefetch_bytes(const void* p, size_t bytes) {
    const char* c = static_cast<const char*>(p);
    for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i);
}

// A KV type: store() writes one token's row (width values) at (block, slot) of K or V (`base`)
// (f16 rows converted by the SIMD level's f32_to_f16),
// load() reads kv head `head`'s head_dim values of a row as f32 into dst, prefetch() asks for
// what load() will read, load_group() (where
// kGroupLoad) reads 16 consecutive slots of a block as one transposed key group, and kF16Operands says
// whether the attention operand that meets this cache (q for K, probabilities for V) is rounded
// to f16 for its dot.

// F16 / F32: a row is width consecutive elements.
template <class Elem>
Elem* elem_row(const KVLayer& kv, void* base, int32_t block, int32_t slot) {
    return static_cast<Elem*>(base) + ((int64_t)block * kv.block_size + slot) * kv_width(kv);
}

struct F16Kv {
    static void store(const KVLayer& kv, void* base, int32_t block, int32_t slot, const float* x,
                      const AttentionMath& math) {
        math.f32_to_f16(x, int32_t(kv_width(kv)), elem_row<uint16_t>(kv, base, block, slot));
    }
    static void load(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head, float* dst,
                     const AttentionMath& math) {
        math.f16_to_f32(head_row(kv, base, block, slot, head), kv.head_dim, dst);
    }
    static const uint16_t* head_row(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head) {
        return elem_row<uint16_t>(kv, base, block, slot) + (int64_t)head * kv.head_dim;
    }
    static void prefetch(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head) {
        prefetch_bytes(head_row(kv, base, block, slot, head), (size_t)kv.head_dim * 2);
    }
    // Slots slot..slot+15 of `block` (one group of 16 keys) straight into the transposed layout.
    static void load_group(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head, float* kt,
                           const AttentionMath& math) {
        math.gather_keys16_f16(elem_row<uint16_t>(kv, base, block, slot) + (int64_t)head * kv.head_dim, kv_width(kv),
                               kv.head_dim, kt);
    }
    static constexpr bool kGroupLoad = true;
    static constexpr bool kF16Operands = true;   // rounded like the kv
    static constexpr bool kRowsF16 = true;       // values read in place by weighted_sum_f16
};

struct F32Kv {
    static void store(const KVLayer& kv, void* base, int32_t block, int32_t slot, const float* x,
                      const AttentionMath&) {
        std::copy(x, x + kv_width(kv), elem_row<float>(kv, base, block, slot));
    }
    static void load(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head, float* dst,
                     const AttentionMath&) {
        const float* r = elem_row<float>(kv, base, block, slot) + (int64_t)head * kv.head_dim;
        std::copy(r, r + kv.head_dim, dst);
    }
    static void prefetch(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head) {
        prefetch_bytes(elem_row<float>(kv, base, block, slot) + (int64_t)head * kv.head_dim, (size_t)kv.head_dim * 4);
    }
    static constexpr bool kGroupLoad = false;   // no load_group: keys one row at a time
    static constexpr bool kF16Operands = false;
    static constexpr bool kRowsF16 = false;
};

// BF16: a row is width consecutive elements, each the top half of an f32 rounded to nearest even.
struct Bf16Kv {
    static void store(const KVLayer& kv, void* base, int32_t block, int32_t slot, const float* x,
                      const AttentionMath&) {
        uint16_t* r = elem_row<uint16_t>(kv, base, block, slot);
        for (int64_t i = 0; i < kv_width(kv); ++i) r[i] = float_to_bf16(x[i]);
    }
    static void load(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head, float* dst,
                     const AttentionMath&) {
        const uint16_t* r = elem_row<uint16_t>(kv, base, block, slot) + (int64_t)head * kv.head_dim;
        for (int32_t i = 0; i < kv.head_dim; ++i) dst[i] = bf16_to_float(r[i]);
    }
    static void prefetch(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head) {
        prefetch_bytes(elem_row<uint16_t>(kv, base, block, slot) + (int64_t)head * kv.head_dim,
                       (size_t)kv.head_dim * 2);
    }
    static constexpr bool kGroupLoad = false;   // no load_group: keys one row at a time
    static constexpr bool kF16Operands = false;
    static constexpr bool kRowsF16 = false;
};

// Q8_0: head-major int8 values, then f16 scales (src/backend/kv_layout.h; head_dim % 32 == 0,
// checked at context creation).
struct Q8Kv {
    struct Head {
        int8_t* q;
        uint16_t* d;
    };
    static Head head_row(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head) {
        const int64_t width = kv_width(kv);
        uint8_t* b = static_cast<uint8_t*>(base) + (size_t)block * kv_block_bytes(GGMLType::Q8_0, kv.block_size, width);
        return {reinterpret_cast<int8_t*>(b) + kv_q8_value(kv.block_size, kv.head_dim, head, slot),
                reinterpret_cast<uint16_t*>(b + (size_t)kv.block_size * width) +
                    kv_q8_scale(kv.block_size, kv.head_dim, head, slot)};
    }
    static void store(const KVLayer& kv, void* base, int32_t block, int32_t slot, const float* x,
                      const AttentionMath&) {
        for (int32_t h = 0; h < kv.n_head_kv; ++h) {
            const Head r = head_row(kv, base, block, slot, h);
            for (int32_t g = 0; g < kv.head_dim / QK8_0; ++g)
                r.d[g] = quantize_group_q8_0(x + (int64_t)h * kv.head_dim + g * QK8_0, r.q + g * QK8_0);
        }
    }
    static void load(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head, float* dst,
                     const AttentionMath&) {
        const Head r = head_row(kv, base, block, slot, head);
        for (int32_t g = 0; g < kv.head_dim / QK8_0; ++g) {
            const float scale = half_to_float(r.d[g]);
            for (int32_t i = g * QK8_0; i < (g + 1) * QK8_0; ++i) dst[i] = float(r.q[i]) * scale;
        }
    }
    static void prefetch(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head) {
        const Head r = head_row(kv, base, block, slot, head);
        prefetch_bytes(r.q, kv.head_dim);
        __builtin_prefetch(r.d);
    }
    static constexpr bool kGroupLoad = false;   // no load_group: keys one row at a time
    static constexpr bool kF16Operands = false;
    static constexpr bool kRowsF16 = false;
};

// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: a row is width / 32 blocks of type T, a head's slice head_dim / 32 of them.
template <GGMLType T>
struct BlockKv {
    static const TypeTraits& traits() {
        static const TypeTraits& t = type_traits(T);
        return t;
    }
    static uint8_t* row(const KVLayer& kv, void* base, int32_t block, int32_t slot) {
        return static_cast<uint8_t*>(base) + ((size_t)block * kv.block_size + slot) * row_bytes(T, kv_width(kv));
    }
    static const uint8_t* head_row(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head) {
        return row(kv, base, block, slot) + (size_t)head * row_bytes(T, kv.head_dim);
    }
    static void store(const KVLayer& kv, void* base, int32_t block, int32_t slot, const float* x,
                      const AttentionMath&) {
        traits().quantize_row(x, row(kv, base, block, slot), kv_width(kv));
    }
    static void load(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head, float* dst,
                     const AttentionMath&) {
        traits().dequantize_row(head_row(kv, base, block, slot, head), dst, kv.head_dim);
    }
    static void prefetch(const KVLayer& kv, void* base, int32_t block, int32_t slot, int32_t head) {
        prefetch_bytes(head_row(kv, base, block, slot, head), row_bytes(T, kv.head_dim));
    }
    static constexpr bool kGroupLoad = false;   // no load_group: keys one row at a time
    static constexpr bool kF16Operands = false;
    static constexpr bool kRowsF16 = false;
};

// Calls f(Kv{}) with the KV type struct of t (check_kv_type admitted only these).
template <class F>
void with_kv_type(GGMLType t, F&& f) {
    switch (t) {
        case GGMLType::F32: f(F32Kv{}); break;
        case GGMLType::BF16: f(Bf16Kv{}); break;
        case GGMLType::Q4_0: f(BlockKv<GGMLType::Q4_0>{}); break;
        case GGMLType::Q4_1: f(BlockKv<GGMLType::Q4_1>{}); break;
        case GGMLType::Q5_0: f(BlockKv<GGMLType::Q5_0>{}); break;
        case GGMLType::Q5_1: f(BlockKv<GGMLType::Q5_1>{}); break;
        case GGMLType::IQ4_NL: f(BlockKv<GGMLType::IQ4_NL>{}); break;
        case GGMLType::Q8_0: f(Q8Kv{}); break;
        default: f(F16Kv{}); break;
    }
}

// Stores x [n_tok][width] into one cache (K or V at `base`).
template <class Kv>
void store_rows(const BatchInfo& batch, const KVLayer& kv, void* base, const float* x, int32_t n_tok,
                const AttentionMath& math) {
    const int64_t width = kv_width(kv);
    for (int32_t t = 0; t < n_tok; ++t) {
        const int32_t pos = batch.pos[t];
        const int32_t block = batch.block_table[(int64_t)batch.seq[t] * batch.max_blocks + pos / kv.block_size];
        Kv::store(kv, base, block, pos % kv.block_size, x + t * width, math);
    }
}

struct Unit {
    int32_t seq, kv_head;
    const int32_t* tokens;   // token indices of the batch, all in `seq`
    int32_t n_tokens;
};

// Per-thread scratch: keys [n_pos/16][D][16], values [n_pos][D] (or f16 value rows where they
// lie), a key row, q, scores, weights [group][n_pos].
struct Scratch {
    std::vector<float> kt, vf, krow, q, prob, w;
    std::vector<const uint16_t*> vrows;
};

template <class K, class V>
void attend_unit(const BatchInfo& batch, const KVLayer& kv, const float* q, const AttentionShape& s, const Unit& u,
                 Scratch& sc, const AttentionMath& math, float* out) {
    const int32_t D = s.head_dim, group = s.n_head / s.n_head_kv;
    const int64_t q_width = (int64_t)s.n_head * D;
    const int32_t* table = &batch.block_table[(int64_t)u.seq * batch.max_blocks];
    // First position token t sees; the unit gathers [lo, n_pos) (scratch index p - lo).
    auto first_pos = [&](int32_t t) {
        const int32_t p = batch.pos[t];
        return s.window > 0 ? std::max(0, p + 1 - s.window) : s.chunk > 0 ? p - p % s.chunk : 0;
    };
    int32_t n_pos = 0, lo = INT32_MAX;
    for (int32_t j = 0; j < u.n_tokens; ++j) {
        n_pos = std::max(n_pos, batch.pos[u.tokens[j]] + 1);
        lo = std::min(lo, first_pos(u.tokens[j]));
    }
    const int32_t n_loc = n_pos - lo;
    const int32_t n_groups = (n_loc + kLanes - 1) / kLanes;
    // No zero fill but for the lanes past n_loc of a partial last group (scores reads them; their
    // results are never used): every other key slot is written below.
    sc.kt.resize((size_t)n_groups * D * kLanes);
    sc.krow.resize(D);
    // A decode step reads each sequence's keys once, from a pool larger than the caches: the rows
    // two groups ahead are fetched while one is converted.
    auto prefetch_keys = [&](int32_t g) {
        for (int32_t i = g * kLanes; i < std::min(n_loc, (g + 1) * kLanes); ++i) {
            const int32_t p = lo + i;
            K::prefetch(kv, kv.k, table[p / kv.block_size], p % kv.block_size, u.kv_head);
        }
    };
    prefetch_keys(0);
    prefetch_keys(1);
    for (int32_t g = 0; g < n_groups; ++g) {
        const int32_t i0 = g * kLanes, n = std::min(kLanes, n_loc - i0);
        float* ktg = &sc.kt[(size_t)g * D * kLanes];
        prefetch_keys(g + 2);
        if constexpr (K::kGroupLoad) {
            // The group's 16 positions in one block: 16 consecutive slots, converted and
            // transposed together.
            const int32_t p0 = lo + i0, slot0 = p0 % kv.block_size;
            if (n == kLanes && slot0 + kLanes <= kv.block_size) {
                K::load_group(kv, kv.k, table[p0 / kv.block_size], slot0, u.kv_head, ktg, math);
                continue;
            }
        }
        if (n < kLanes) std::fill(ktg, ktg + (size_t)D * kLanes, 0.f);
        for (int32_t l = 0; l < n; ++l) {
            const int32_t p = lo + i0 + l;
            K::load(kv, kv.k, table[p / kv.block_size], p % kv.block_size, u.kv_head, sc.krow.data(), math);
            for (int32_t d = 0; d < D; ++d) ktg[d * kLanes + l] = sc.krow[d];
        }
    }
    if constexpr (V::kRowsF16) {
        sc.vrows.resize(n_loc);
        for (int32_t i = 0; i < n_loc; ++i) {
            const int32_t p = lo + i;
            sc.vrows[i] = V::head_row(kv, kv.v, table[p / kv.block_size], p % kv.block_size, u.kv_head);
        }
    } else {
        sc.vf.resize((size_t)n_loc * D);
        for (int32_t i = 0; i < n_loc; ++i) {
            const int32_t p = lo + i;
            V::load(kv, kv.v, table[p / kv.block_size], p % kv.block_size, u.kv_head, &sc.vf[(size_t)i * D], math);
        }
    }
    sc.q.resize(D);
    sc.prob.resize((size_t)n_groups * kLanes);
    sc.w.resize((size_t)group * n_loc);
    for (int32_t j = 0; j < u.n_tokens; ++j) {
        const int32_t t = u.tokens[j];
        const int32_t end = batch.pos[t] + 1 - lo, off = first_pos(t) - lo, len = end - off;
        float* prob = sc.prob.data() + off;
        float* out_t = out + t * q_width + (int64_t)u.kv_head * group * D;
        for (int32_t g = 0; g < group; ++g) {
            const int32_t h = u.kv_head * group + g;
            float* w = sc.w.data() + (size_t)g * n_loc;
            math.scale_round(q + t * q_width + (int64_t)h * D, D, 1.0f, K::kF16Operands, sc.q.data());
            math.scores(sc.q.data(), sc.kt.data(), D, (end + kLanes - 1) / kLanes, s.scale, sc.prob.data());
            if (s.softcap > 0.0f)
                for (int32_t p = 0; p < len; ++p) prob[p] = softcap_score(prob[p], s.softcap);
            // A sink is one more logit of the softmax that has no value row: it joins the max and the
            // denominator only.
            const float m = s.sinks ? std::max(math.max(prob, len), s.sinks[h]) : math.max(prob, len);
            math.exp_shifted(prob, len, m);
            double sum = 0.0;
            for (int32_t p = 0; p < len; ++p) sum += prob[p];
            if (s.sinks) sum += std::exp(s.sinks[h] - m);
            math.scale_round(prob, len, (float)(1.0 / sum), V::kF16Operands, w);
            if constexpr (!V::kRowsF16) math.weighted_sum(w, sc.vf.data() + (size_t)off * D, D, len, out_t + g * D);
        }
        if constexpr (V::kRowsF16)
            math.weighted_sum_f16(sc.w.data(), n_loc, group, sc.vrows.data() + off, D, len, out_t, D);
    }
}

template <class K, class V>
void attend(ThreadPool& pool, const BatchInfo& batch, const KVLayer& kv, const float* q, int32_t n_tok,
            const AttentionShape& s, const AttentionMath& math, float* out) {
    std::vector<std::vector<int32_t>> by_seq(batch.n_seq);
    for (int32_t t = 0; t < n_tok; ++t) by_seq[batch.seq[t]].push_back(t);
    std::vector<Unit> units;
    for (int32_t sq = 0; sq < batch.n_seq; ++sq)
        for (int32_t kvh = 0; kvh < s.n_head_kv; ++kvh)
            for (size_t j = 0; j < by_seq[sq].size(); j += kTokensPerUnit)
                units.push_back(
                    {sq, kvh, by_seq[sq].data() + j, (int32_t)std::min<size_t>(kTokensPerUnit, by_seq[sq].size() - j)});
    pool.parallel_for((int64_t)units.size(), 1, [&](int64_t b, int64_t e) {
        thread_local Scratch sc;
        for (int64_t i = b; i < e; ++i) attend_unit<K, V>(batch, kv, q, s, units[i], sc, math, out);
    });
}

}  // namespace

void CpuBackend::kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
    const AttentionMath& math = attention_math(kv.head_dim, simd_);
    with_kv_type(kv.k_type, [&](auto kt) { store_rows<decltype(kt)>(batch_, kv, kv.k, k, n_tok, math); });
    if (kv.v != kv.k)
        with_kv_type(kv.v_type, [&](auto vt) { store_rows<decltype(vt)>(batch_, kv, kv.v, v, n_tok, math); });
}

void CpuBackend::attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& s, float* out) {
    if (!(s.softcap >= 0.0f) || std::isinf(s.softcap))
        fail("cpu attention: softcap must be 0 (none) or a positive number, got ", s.softcap);
    if (s.chunk < 0 || (s.chunk > 0 && s.window > 0))
        fail("cpu attention: chunk must be 0 (none) or positive, and not with a window; got chunk ", s.chunk,
             ", window ", s.window);
    const AttentionMath& math = attention_math(s.head_dim, simd_);
    with_kv_type(kv.k_type, [&](auto kt) {
        with_kv_type(kv.v_type,
                     [&](auto vt) { attend<decltype(kt), decltype(vt)>(pool_, batch_, kv, q, n_tok, s, math, out); });
    });
}

}  // namespace ember
