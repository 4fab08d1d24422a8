// The CUDA backend's attention dispatch and KV stores: the kernel comes from choose_attention
// (kernel_choice.h); here its arguments are filled in (tiles, splits and their scratch, the f16
// copy of q8_0, q4/q5 or bf16 blocks for kernels that read f16) and it is launched.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "backend/kv_layout.h"
#include "cuda_backend_impl.h"
#include "cuda_check.h"

namespace ember {
namespace cuda {

static_assert(kMaxAttnHeadDim == kGpuMaxHeadDim, "the model layer refuses wider heads at placement by this figure");

AttentionQuery CudaBackend::attention_query(const KVLayer& kv, const AttentionShape& shape, int32_t n_tok) const {
    AttentionQuery q;
    q.k_type = kv.k_type;
    q.v_type = kv.v_type;
    q.head_dim = shape.head_dim;
    q.n_head = shape.n_head;
    q.n_head_kv = shape.n_head_kv;
    q.block_size = kv.block_size;
    q.max_len = max_len_;
    // A chunk bounds the keys a query sees as a window of its size does.
    q.window = shape.window > 0 ? shape.window : shape.chunk;
    q.batch = batch_facts(n_tok);
    q.fast_attention = fast_attn_;
    q.sw = sw_;
    q.dev = dev_;
    return q;
}

void CudaBackend::kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
    issue_uploads();
    check_batch(n_tok, "kv_store");
    check_kv(kv, "kv_store");
    if (kv.k_type == GGMLType::Q8_0 && kv.v_type == GGMLType::Q8_0) return store_q8(kv, k, v, n_tok);
    if (kv.k_type != GGMLType::F16 || kv.v_type != GGMLType::F16) return store_mixed(kv, k, v, n_tok);
    cuda::kv_store(static_cast<__half*>(kv.k), static_cast<__half*>(kv.v), kv.block_size, kv.n_head_kv * kv.head_dim, k,
                   v, n_tok, dbatch_, stream_);
}

void CudaBackend::attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape, float* out) {
    issue_uploads();
    attend(kv, q, n_tok, shape, out, false);
}

void CudaBackend::check_kv(const KVLayer& kv, const char* op) const {
    for (GGMLType t : {kv.k_type, kv.v_type})
        if (t != GGMLType::F16 && t != GGMLType::BF16 && t != GGMLType::F32 && !kv_type_is_blocked(t))
            fail("cuda ", op,
                 ": the GPU keeps KV in f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl, not in GGML type ",
                 int(t));
}

// The attention of q over kv into out. want_q8: the kernels that can also write out as q8_1 blocks
// into the scratch do; returns whether they did.
bool CudaBackend::attend(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape, float* out,
                         bool want_q8) {
    check_batch(n_tok, "attention");
    check_kv(kv, "attention");
    if (shape.n_head_kv != kv.n_head_kv || shape.head_dim != kv.head_dim)
        fail("cuda attention: shape (", shape.n_head_kv, " kv heads of ", shape.head_dim,
             ") does not match the KV layer (", kv.n_head_kv, " of ", kv.head_dim, ")");
    if (shape.window < 0) fail("cuda attention: negative window ", shape.window);
    if (shape.chunk < 0 || (shape.chunk > 0 && shape.window > 0))
        fail("cuda attention: chunk must be 0 (none) or positive, and not with a window; got chunk ", shape.chunk,
             ", window ", shape.window);
    if (!(shape.softcap >= 0.f) || std::isinf(shape.softcap))
        fail("cuda attention: softcap must be 0 (none) or a positive number, got ", shape.softcap);
    if (n_tok == 0) return false;
    const AttentionQuery query = attention_query(kv, shape, n_tok);
    AttentionChoice c = choose_attention(query);
    AttentionArgs a{};
    a.k_cache = static_cast<const __half*>(kv.k);
    a.v_cache = static_cast<const __half*>(kv.v);
    a.kv_q8 = c.kernel == AttentionKernel::decode_q8;
    if (c.expand_q8) expand_to_f16(kv, a);
    a.block_size = kv.block_size;
    a.cache_rows = int64_t(kv.n_blocks) * kv.block_size;
    a.n_head = shape.n_head;
    a.n_head_kv = shape.n_head_kv;
    a.head_dim = shape.head_dim;
    a.scale = shape.scale;
    a.window = shape.window;
    a.chunk = shape.chunk;
    a.sinks = shape.sinks;
    a.softcap = shape.softcap;
    a.q = q;
    a.out = out;
    a.n_tok = n_tok;
    a.heads_per_cta = c.heads_per_cta;
    // The exact, short and decode kernels write q8_1 blocks along with their output.
    auto with_q8_out = [&](auto&& launch) {
        if (want_q8) {
            const Q8 q8 = q8_scratch(int64_t(n_tok) * shape.n_head * shape.head_dim);
            a.out_q = q8.q;
            a.out_ds = q8.ds;
        }
        launch();
        return want_q8;
    };
    if (c.kernel == AttentionKernel::short_decode) {
        bool took = false;
        const bool q8 = with_q8_out([&] { took = attention_short(a, dbatch_, max_len_, stream_); });
        if (took) return q8;
        a.out_q = nullptr;
        a.out_ds = nullptr;
        c = choose_attention_without_short(query);
    }
    const int n_rep = shape.n_head / shape.n_head_kv;
    const int n_hchunks = (n_rep + a.heads_per_cta - 1) / a.heads_per_cta;
    switch (c.kernel) {
        case AttentionKernel::exact:
        case AttentionKernel::exact_cluster:
            return with_q8_out([&] {
                a.old_rows_ready = decode_step(n_tok);
                attention_exact(a, dbatch_, sw_.exact_cluster, stream_);
            });
        case AttentionKernel::decode_q8:
        case AttentionKernel::decode_mma: {
            const int n_dec = attention_decode_heads(shape.n_head, shape.n_head_kv, shape.head_dim, a.kv_q8);
            a.n_split = c.n_split;
            prepare_splits(a, size_t(n_tok) * shape.n_head_kv * ((n_rep + n_dec - 1) / n_dec));
            return with_q8_out([&] {
                if (a.kv_q8) attention_decode(a, dbatch_, stream_);
                else attention_decode_mma(a, dbatch_, stream_);
            });
        }
        case AttentionKernel::prefill_mma:
            a.tile_len = kTileLens[c.tile_index];
            a.n_tiles = n_tiles_[c.tile_index];
            a.tiles = tiles_for(c.tile_index);
            a.n_split = 1;
            if (!attention_prefill_mma(a, dbatch_, stream_))
                fail("cuda attention: prefill_mma declined head_dim ", a.head_dim);
            return false;
        case AttentionKernel::
            tiled_invariant:   // one query per tile, one split: nothing depends on the rest of the batch
        case AttentionKernel::tiled: {
            a.tile_len = kTileLens[c.tile_index];
            a.n_tiles = n_tiles_[c.tile_index];
            a.tiles = tiles_for(c.tile_index);
            const int base = a.n_tiles * shape.n_head_kv * n_hchunks;
            a.n_split = c.kernel == AttentionKernel::tiled_invariant
                            ? 1
                            : attention_splits(attention_want_splits(max_len_, query.window), base, kTargetAttnCtas);
            prepare_splits(a, size_t(base));
            cuda::attention(a, dbatch_, stream_);
            return false;
        }
        case AttentionKernel::float32:
            attention_float(a, kv.k_type == GGMLType::F32, kv.v_type == GGMLType::F32, dbatch_, stream_);
            return false;
        case AttentionKernel::short_decode: break;
    }
    fail("cuda attention: no kernel after attention_short declined");
}

void CudaBackend::store_q8(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
    kv_store_q8(static_cast<uint8_t*>(kv.k), static_cast<uint8_t*>(kv.v), kv.block_size, kv.n_head_kv * kv.head_dim,
                kv.head_dim, k, v, n_tok, dbatch_, stream_);
}

// A layer with caches of other types than f16 or q8_0 alone: each cache stored by the kernel of its
// type (a kernel given no cache of its type launches nothing).
void CudaBackend::store_mixed(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
    const int32_t width = kv.n_head_kv * kv.head_dim;
    const auto cache = [&](void* c, GGMLType t, GGMLType want) { return t == want ? c : nullptr; };
    kv_store_q8(static_cast<uint8_t*>(cache(kv.k, kv.k_type, GGMLType::Q8_0)),
                static_cast<uint8_t*>(cache(kv.v, kv.v_type, GGMLType::Q8_0)), kv.block_size, width, kv.head_dim, k, v,
                n_tok, dbatch_, stream_);
    for (const auto& [c, t, x] : {std::tuple{kv.k, kv.k_type, k}, std::tuple{kv.v, kv.v_type, v}})
        if (kv_type_is_blocked(t) && t != GGMLType::Q8_0)
            kv_store_legacy(t, static_cast<uint8_t*>(c), nullptr, kv.block_size, width, x, nullptr, n_tok, dbatch_,
                            stream_);
    kv_store_bf16(static_cast<uint16_t*>(cache(kv.k, kv.k_type, GGMLType::BF16)),
                  static_cast<uint16_t*>(cache(kv.v, kv.v_type, GGMLType::BF16)), kv.block_size, width, k, v, n_tok,
                  dbatch_, stream_);
    kv_store_f32(static_cast<float*>(cache(kv.k, kv.k_type, GGMLType::F32)),
                 static_cast<float*>(cache(kv.v, kv.v_type, GGMLType::F32)), kv.block_size, width, k, v, n_tok, dbatch_,
                 stream_);
    __half* kh = static_cast<__half*>(cache(kv.k, kv.k_type, GGMLType::F16));
    __half* vh = static_cast<__half*>(cache(kv.v, kv.v_type, GGMLType::F16));
    if (kh || vh) cuda::kv_store(kh, vh, kv.block_size, width, k, v, n_tok, dbatch_, stream_);
}

// The batch's blocks of the layer's q8_0, q4/q5 and bf16 caches as f16 in kv_f16_ (one layer's worth,
// reused by all); a.k_cache / a.v_cache point at the copies.
void CudaBackend::expand_to_f16(const KVLayer& kv, AttentionArgs& a) {
    const int64_t width = int64_t(kv.n_head_kv) * kv.head_dim, n = int64_t(kv.n_blocks) * kv.block_size * width;
    ensure(kv_f16_, size_t(n) * 2 * sizeof(__half));
    __half* kh = static_cast<__half*>(kv_f16_.p);
    const int32_t n_blk = std::min<int32_t>(bt_stride_, (max_len_ + kv.block_size - 1) / kv.block_size);
    const bool k_q8 = kv.k_type == GGMLType::Q8_0, v_q8 = kv.v_type == GGMLType::Q8_0;
    const bool k_bf = kv.k_type == GGMLType::BF16, v_bf = kv.v_type == GGMLType::BF16;
    if (k_q8 || v_q8)
        kv_expand_q8(k_q8 ? static_cast<const uint8_t*>(kv.k) : nullptr,
                     v_q8 ? static_cast<const uint8_t*>(kv.v) : nullptr, kh, kh + n, kv.block_size, int32_t(width),
                     kv.head_dim, kv.n_blocks, n_seq_, n_blk, dbatch_, stream_);
    kv_expand_bf16(k_bf ? static_cast<const uint16_t*>(kv.k) : nullptr,
                   v_bf ? static_cast<const uint16_t*>(kv.v) : nullptr, kh, kh + n, kv.block_size, int32_t(width),
                   kv.n_blocks, n_seq_, n_blk, dbatch_, stream_);
    const bool k_legacy = kv_type_is_blocked(kv.k_type) && !k_q8, v_legacy = kv_type_is_blocked(kv.v_type) && !v_q8;
    if (k_legacy)
        kv_expand_legacy(kv.k_type, static_cast<const uint8_t*>(kv.k), nullptr, kh, nullptr, kv.block_size,
                         int32_t(width), kv.n_blocks, n_seq_, n_blk, dbatch_, stream_);
    if (v_legacy)
        kv_expand_legacy(kv.v_type, static_cast<const uint8_t*>(kv.v), nullptr, kh + n, nullptr, kv.block_size,
                         int32_t(width), kv.n_blocks, n_seq_, n_blk, dbatch_, stream_);
    if (k_q8 || k_bf || k_legacy) a.k_cache = kh;
    if (v_q8 || v_bf || v_legacy) a.v_cache = kh + n;
}

// Partial-result buffers and per-CTA-group counters of a split (flash-decoding) attention.
void CudaBackend::prepare_splits(AttentionArgs& a, size_t n_groups) {
    if (a.n_split <= 1) return;
    const size_t slots = size_t(a.n_split) * a.n_tok * a.n_head;
    ensure(part_acc_, slots * a.head_dim * 4);
    ensure(part_ml_, slots * sizeof(float2));
    a.part_acc = static_cast<float*>(part_acc_.p);
    a.part_ml = static_cast<float2*>(part_ml_.p);
    if (ensure(split_ctr_, n_groups * sizeof(int32_t)))   // counters start at zero, kernels reset them
        EMBER_CUDA_CHECK(cudaMemsetAsync(split_ctr_.p, 0, split_ctr_.cap, stream_));
    a.split_counter = static_cast<int32_t*>(split_ctr_.p);
}

// The rotations of `params` for the batch's positions. A first use allocates the table (set_batch
// grows it later), which moves a buffer as growing does.
const float2* CudaBackend::rope_table(const RopeParams& params) {
    bool moved = false;
    const float2* t = ropes_.get(params, max_len_, stream_, moved);
    if (moved) invalidate_graphs();
    return t;
}

}  // namespace cuda
}  // namespace ember
