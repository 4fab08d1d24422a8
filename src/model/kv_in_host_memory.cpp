// KVInHostMemory: the GPU's ops around KV kept in host memory (-nkvo; kv_in_host_memory.h).
#include "model/kv_in_host_memory.h"

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

KVInHostMemory::KVInHostMemory(Backend& gpu, const KVLayer& geometry, int32_t n_layers, size_t gpu_cache_bytes)
    : gpu_(gpu), geometry_(geometry) {
    const int64_t width = (int64_t)geometry.n_head_kv * geometry.head_dim;
    block_bytes_[0] = kv_block_bytes(geometry.k_type, geometry.block_size, width);
    block_bytes_[1] = kv_block_bytes(geometry.v_type, geometry.block_size, width);
    staging_ = gpu_.alloc(layer_bytes(geometry.k_type, geometry) + layer_bytes(geometry.v_type, geometry));
    layers_.reserve(n_layers);
    const size_t slot_bytes = (size_t)std::max(n_layers, 1) * (block_bytes_[0] + block_bytes_[1]);
    const int32_t want = (int32_t)std::min<size_t>(geometry.n_blocks, gpu_cache_bytes / slot_bytes);
    for (int32_t n = want; n > 0 && !cache_; n /= 2) {
        try {
            cache_ = gpu_.alloc((size_t)n * slot_bytes);
            n_slots_ = n;
        } catch (const OutOfMemory&) {}
    }
    if (n_slots_ < want)
        std::fprintf(
            stderr,
            "ember: warning: the GPU cache of the KV in host memory (-nkvo) holds %d of %d blocks (%zu of %zu MiB): "
            "the GPU has no room for more\n",
            n_slots_, want, (size_t)n_slots_ * slot_bytes >> 20, (size_t)want * slot_bytes >> 20);
    slot_of_.assign(geometry.n_blocks, -1);
    block_in_slot_.assign(n_slots_, -1);
}

KVInHostMemory::~KVInHostMemory() {
    gpu_.free(staging_);
    gpu_.free(cache_);
    for (void* p : pinned_) gpu_.free_host(p);
    for (void* p : plain_) std::free(p);
}

void* KVInHostMemory::alloc_host_memory(size_t bytes) {
    try {
        void* p = gpu_.alloc_host(bytes);
        pinned_.push_back(p);
        return p;
    } catch (const OutOfMemory& e) {
        static bool warned = false;
        if (!warned) {
            std::fprintf(stderr,
                         "ember: warning: %s; the KV in host memory (-nkvo) uses pageable memory (slower copies)\n",
                         e.what());
            warned = true;
        }
    }
    void* p = std::malloc(bytes);
    if (!p)
        throw OutOfMemory(cat("KV in host memory (-nkvo): could not allocate ", bytes >> 20, " MiB of host memory"));
    plain_.push_back(p);
    return p;
}

void KVInHostMemory::alloc_layer(KVLayer& kv) {
    if (layers_.size() == layers_.capacity())
        fail("KV in host memory (-nkvo): more layers than the ", layers_.size(), " it was sized for");
    Layer layer;
    for (int i = 0; i < 2; ++i) {
        layer.host[i] = static_cast<uint8_t*>(alloc_host_memory((size_t)geometry_.n_blocks * block_bytes_[i]));
        layer.cache[i] = static_cast<uint8_t*>(cache_) +
                         (size_t)n_slots_ *
                             (layers_.size() * (block_bytes_[0] + block_bytes_[1]) + i * block_bytes_[0]);
    }
    layer.holds.assign(n_slots_, -1);
    kv.k = layer.host[0];
    kv.v = layer.host[1];
    layers_.push_back(std::move(layer));
}

KVInHostMemory::Layer& KVInHostMemory::layer_of(const KVLayer& kv) {
    for (Layer& l : layers_)
        if (l.host[0] == kv.k) return l;
    fail("KV in host memory (-nkvo): a KV layer this backend does not hold");
}

bool KVInHostMemory::in_host_memory(const void* p) const {
    const auto* c = static_cast<const uint8_t*>(p);
    for (const Layer& l : layers_)
        for (int i = 0; i < 2; ++i)
            if (c >= l.host[i] && c < l.host[i] + (size_t)geometry_.n_blocks * block_bytes_[i]) return true;
    return false;
}

void KVInHostMemory::host_copy(void* dst, const void* src, size_t bytes) {
    gpu_.synchronize();
    std::memcpy(dst, src, bytes);
    const auto* c = static_cast<const uint8_t*>(dst);
    for (Layer& l : layers_)
        for (int i = 0; i < 2; ++i) {
            const size_t bb = block_bytes_[i];
            if (bytes == 0 || c < l.host[i] || c >= l.host[i] + (size_t)geometry_.n_blocks * bb) continue;
            const size_t first = (size_t)(c - l.host[i]) / bb, last = (size_t)(c + bytes - 1 - l.host[i]) / bb;
            for (size_t b = first; b <= last && b < slot_of_.size(); ++b)
                if (slot_of_[b] >= 0) l.holds[slot_of_[b]] = -1;
        }
}

void KVInHostMemory::copy_from_host(void* dst, const void* src, size_t bytes) {
    if (in_host_memory(dst)) host_copy(dst, src, bytes);
    else gpu_.copy_from_host(dst, src, bytes);
}

void KVInHostMemory::copy_to_host(void* dst, const void* src, size_t bytes) {
    if (in_host_memory(src)) {
        gpu_.synchronize();
        std::memcpy(dst, src, bytes);
    } else {
        gpu_.copy_to_host(dst, src, bytes);
    }
}

KVLayer KVInHostMemory::staged(const KVLayer& host) const {
    KVLayer s = host;
    s.k = staging_;
    s.v = static_cast<uint8_t*>(staging_) + layer_bytes(host.k_type, host);
    return s;
}

void KVInHostMemory::set_batch(const BatchInfo& batch) {
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
    on_cache_ = false;
    if (n_slots_ == 0) {
        gpu_.set_batch(batch);
        return;
    }
    // The cache follows the step's blocks: a block this step does not touch gives its slot up
    // (its sequence finished, waits or was preempted), and the step's uncached blocks take the
    // free slots in id order. Steps over the same sequences keep the same blocks cached.
    std::vector<int32_t> step(written_.size() + read_.size());
    std::merge(written_.begin(), written_.end(), read_.begin(), read_.end(), step.begin());
    for (int32_t slot = 0; slot < n_slots_; ++slot) {
        const int32_t b = block_in_slot_[slot];
        if (b < 0 || std::binary_search(step.begin(), step.end(), b)) continue;
        block_in_slot_[slot] = slot_of_[b] = -1;
        for (Layer& l : layers_) l.holds[slot] = -1;
    }
    int32_t free_slot = 0;
    for (int32_t b : step) {
        if (slot_of_[b] >= 0) continue;
        while (free_slot < n_slots_ && block_in_slot_[free_slot] >= 0) ++free_slot;
        if (free_slot == n_slots_) break;
        block_in_slot_[free_slot] = b;
        slot_of_[b] = free_slot;
    }
    on_cache_ = std::all_of(step.begin(), step.end(), [&](int32_t b) { return slot_of_[b] >= 0; });
    if (!on_cache_) {
        gpu_.set_batch(batch);
        return;
    }
    // Table entries past a sequence's last position are not read: any slot will do for them.
    BatchInfo on_slots = batch;
    for (int32_t& b : on_slots.block_table) b = b >= 0 && b < geometry_.n_blocks ? std::max(slot_of_[b], 0) : 0;
    gpu_.set_batch(on_slots);
}

KVLayer KVInHostMemory::cached(const Layer& layer, const KVLayer& host) const {
    KVLayer c = host;
    c.k = layer.cache[0];
    c.v = layer.cache[1];
    c.n_blocks = n_slots_;
    return c;
}

void KVInHostMemory::sync_slots(Layer& layer, const std::vector<int32_t>& ids, bool to_host) {
    auto up = [&](void* dst, const void* src, size_t n) { gpu_.copy_from_host(dst, src, n); };
    auto down = [&](void* dst, const void* src, size_t n) { gpu_.copy_to_host_async(dst, src, n); };
    for (int i = 0; i < 2; ++i) {
        const size_t bb = block_bytes_[i];
        CopyRuns<decltype(up)> from_host(up);
        CopyRuns<decltype(down)> back(down);
        for (int32_t id : ids) {
            uint8_t* slot = layer.cache[i] + slot_of_[id] * bb;
            if (to_host) back.add(layer.host[i] + id * bb, slot, bb);
            else if (layer.holds[slot_of_[id]] != id) from_host.add(slot, layer.host[i] + id * bb, bb);
        }
        from_host.flush();
        back.flush();
    }
    for (int32_t id : ids) layer.holds[slot_of_[id]] = id;
}

void KVInHostMemory::stage(Layer& layer, const KVLayer& s, const std::vector<int32_t>& ids) {
    auto up = [&](void* dst, const void* src, size_t n) { gpu_.copy_from_host(dst, src, n); };
    auto on_gpu = [&](void* dst, const void* src, size_t n) { gpu_.copy(dst, src, n); };
    for (int i = 0; i < 2; ++i) {
        const size_t bb = block_bytes_[i];
        uint8_t* st = static_cast<uint8_t*>(i ? s.v : s.k);
        CopyRuns<decltype(up)> from_host(up);
        CopyRuns<decltype(on_gpu)> from_cache(on_gpu);
        for (int32_t id : ids) {
            const int32_t slot = slot_of_[id];
            if (slot >= 0 && layer.holds[slot] == id) from_cache.add(st + id * bb, layer.cache[i] + slot * bb, bb);
            else from_host.add(st + id * bb, layer.host[i] + id * bb, bb);
        }
        from_host.flush();
        from_cache.flush();
        // Blocks that came from host memory and have a slot fill it (after their upload: one stream).
        CopyRuns<decltype(on_gpu)> fill(on_gpu);
        for (int32_t id : ids) {
            const int32_t slot = slot_of_[id];
            if (slot >= 0 && layer.holds[slot] != id) fill.add(layer.cache[i] + slot * bb, st + id * bb, bb);
        }
        fill.flush();
    }
    for (int32_t id : ids)
        if (slot_of_[id] >= 0) layer.holds[slot_of_[id]] = id;
}

void KVInHostMemory::write_back(Layer& layer, const KVLayer& s, const std::vector<int32_t>& ids) {
    auto down = [&](void* dst, const void* src, size_t n) { gpu_.copy_to_host_async(dst, src, n); };
    auto on_gpu = [&](void* dst, const void* src, size_t n) { gpu_.copy(dst, src, n); };
    for (int i = 0; i < 2; ++i) {
        const size_t bb = block_bytes_[i];
        const uint8_t* st = static_cast<const uint8_t*>(i ? s.v : s.k);
        CopyRuns<decltype(down)> to_host(down);
        CopyRuns<decltype(on_gpu)> to_cache(on_gpu);
        for (int32_t id : ids) {
            to_host.add(layer.host[i] + id * bb, st + id * bb, bb);
            if (slot_of_[id] >= 0) to_cache.add(layer.cache[i] + slot_of_[id] * bb, st + id * bb, bb);
        }
        to_host.flush();
        to_cache.flush();
    }
    for (int32_t id : ids)
        if (slot_of_[id] >= 0) layer.holds[slot_of_[id]] = id;
}

// The blocks that take the new rows go up whole (their older rows with them), get the rows on
// the GPU, and come back; attention reads them from the staging, where they still are.
void KVInHostMemory::kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) {
    Layer& layer = layer_of(kv);
    if (on_cache_) {
        KVLayer c = cached(layer, kv);
        sync_slots(layer, written_, false);
        gpu_.kv_store(c, k, v, n_tok);
        sync_slots(layer, written_, true);
        return;
    }
    KVLayer s = staged(kv);
    stage(layer, s, written_);
    gpu_.kv_store(s, k, v, n_tok);
    write_back(layer, s, written_);
}

void KVInHostMemory::attn_in(const AttnInWeights& w, float* x, const float* residual, int32_t n_tok, KVLayer& kv,
                             const BlockBuffers& b) {
    Layer& layer = layer_of(kv);
    if (on_cache_) {
        KVLayer c = cached(layer, kv);
        sync_slots(layer, written_, false);
        gpu_.attn_in(w, x, residual, n_tok, c, b);
        sync_slots(layer, written_, true);
        return;
    }
    KVLayer s = staged(kv);
    stage(layer, s, written_);
    gpu_.attn_in(w, x, residual, n_tok, s, b);
    write_back(layer, s, written_);
}

void KVInHostMemory::attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape,
                               float* out) {
    Layer& layer = layer_of(kv);
    if (on_cache_) {
        sync_slots(layer, read_, false);
        gpu_.attention(cached(layer, kv), q, n_tok, shape, out);
        return;
    }
    KVLayer s = staged(kv);
    stage(layer, s, read_);
    gpu_.attention(s, q, n_tok, shape, out);
}

void KVInHostMemory::attn_out(const KVLayer& kv, const AttentionShape& shape, const Weight& wo, int32_t n_tok,
                              const BlockBuffers& b, float* out) {
    Layer& layer = layer_of(kv);
    if (on_cache_) {
        sync_slots(layer, read_, false);
        gpu_.attn_out(cached(layer, kv), shape, wo, n_tok, b, out);
        return;
    }
    KVLayer s = staged(kv);
    stage(layer, s, read_);
    gpu_.attn_out(s, shape, wo, n_tok, b, out);
}

}  // namespace ember
