// HostKVBackend: the GPU's ops around host-resident KV (host_kv.h).
#include "model/host_kv.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/kv_copy.h"
#include "backend/kv_layout.h"

namespace ember {
namespace {

size_t layer_bytes(GGMLType type, const KVLayer& g) {
    return (size_t)g.n_blocks * kv_block_bytes(type, g.block_size, (int64_t)g.n_head_kv * g.head_dim);
}

}  // namespace

HostKVBackend::HostKVBackend(Backend& gpu, const KVLayer& geometry) : gpu_(gpu), geometry_(geometry) {
    staging_ = gpu_.alloc(layer_bytes(geometry.k_type, geometry) + layer_bytes(geometry.v_type, geometry));
}

HostKVBackend::~HostKVBackend() {
    gpu_.free(staging_);
    for (void* p : pinned_) gpu_.free_host(p);
    for (void* p : plain_) std::free(p);
}

void* HostKVBackend::alloc_kv(size_t bytes) {
    try {
        void* p = gpu_.alloc_host(bytes);
        pinned_.push_back(p);
        kv_ranges_.emplace_back(static_cast<const uint8_t*>(p), bytes);
        return p;
    } catch (const OutOfMemory& e) {
        static bool warned = false;
        if (!warned) {
            std::fprintf(stderr, "ember: warning: %s; the host KV uses pageable memory (slower copies)\n", e.what());
            warned = true;
        }
    }
    void* p = std::malloc(bytes);
    if (!p) throw OutOfMemory(cat("host KV: could not allocate ", bytes >> 20, " MiB of host memory"));
    plain_.push_back(p);
    kv_ranges_.emplace_back(static_cast<const uint8_t*>(p), bytes);
    return p;
}

bool HostKVBackend::in_host_kv(const void* p) const {
    const auto* c = static_cast<const uint8_t*>(p);
    for (auto [base, bytes] : kv_ranges_)
        if (c >= base && c < base + bytes) return true;
    return false;
}

void HostKVBackend::host_copy(void* dst, const void* src, size_t bytes) {
    gpu_.synchronize();
    std::memcpy(dst, src, bytes);
}

void HostKVBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
    if (in_host_kv(dst)) host_copy(dst, src, bytes);
    else gpu_.copy_from_host(dst, src, bytes);
}

void HostKVBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
    if (in_host_kv(src)) host_copy(dst, src, bytes);
    else gpu_.copy_to_host(dst, src, bytes);
}

void HostKVBackend::copy(void* dst, const void* src, size_t bytes) {
    if (in_host_kv(dst)) host_copy(dst, src, bytes);
    else gpu_.copy(dst, src, bytes);
}

KVLayer HostKVBackend::staged(const KVLayer& host) const {
    KVLayer s = host;
    s.k = staging_;
    s.v = static_cast<uint8_t*>(staging_) + layer_bytes(host.k_type, host);
    return s;
}

void HostKVBackend::set_batch(const BatchInfo& batch) {
    gpu_.set_batch(batch);
    const int32_t bs = geometry_.block_size;
    written_.clear();
    read_.clear();
    std::vector<int32_t> last(batch.n_seq, -1);   // each sequence's last position in the step
    for (int32_t i = 0; i < batch.n_tok; ++i) {
        const int32_t s = batch.seq[i];
        written_.push_back(batch.block_table[(size_t)s * batch.max_blocks + batch.pos[i] / bs]);
        last[s] = std::max(last[s], batch.pos[i]);
    }
    std::sort(written_.begin(), written_.end());
    written_.erase(std::unique(written_.begin(), written_.end()), written_.end());
    for (int32_t s = 0; s < batch.n_seq; ++s)
        for (int32_t b = 0; b <= last[s] / bs && last[s] >= 0; ++b) {
            const int32_t id = batch.block_table[(size_t)s * batch.max_blocks + b];
            if (!std::binary_search(written_.begin(), written_.end(), id)) read_.push_back(id);
        }
    std::sort(read_.begin(), read_.end());
    read_.erase(std::unique(read_.begin(), read_.end()), read_.end());
}

void HostKVBackend::copy_blocks(const KVLayer& from, KVLayer& to, const std::vector<int32_t>& ids, bool to_gpu) {
    copy_kv_block_runs(from, to, ids.data(), ids.size(), [&](void* dst, const void* src, size_t bytes) {
        if (to_gpu) gpu_.copy_from_host(dst, src, bytes);
        else gpu_.copy_to_host_async(dst, src, bytes);
    });
}

// The blocks that take the new rows go up whole (their older rows with them), get the rows on
// the GPU, and come back; attention reads them from the staging, where they still are.
void HostKVBackend::kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
    KVLayer s = staged(kv);
    copy_blocks(kv, s, written_, true);
    gpu_.kv_store(s, k, v, n_tok);
    copy_blocks(s, kv, written_, false);
}

void HostKVBackend::attn_in(const AttnInWeights& w, float* x, const float* residual, int32_t n_tok, KVLayer& kv,
                            const BlockBuffers& b) {
    KVLayer s = staged(kv);
    copy_blocks(kv, s, written_, true);
    gpu_.attn_in(w, x, residual, n_tok, s, b);
    copy_blocks(s, kv, written_, false);
}

void HostKVBackend::attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape,
                              float* out) {
    KVLayer s = staged(kv);
    copy_blocks(kv, s, read_, true);
    gpu_.attention(s, q, n_tok, shape, out);
}

void HostKVBackend::attn_out(const KVLayer& kv, const AttentionShape& shape, const Weight& wo, int32_t n_tok,
                             const BlockBuffers& b, float* out) {
    KVLayer s = staged(kv);
    copy_blocks(kv, s, read_, true);
    gpu_.attn_out(s, shape, wo, n_tok, b, out);
}

}  // namespace ember
