// The host tier's bytes (kv_host_mb): per layer, K and V arrays of block-sized slots that the
// engine swaps preempted sequences into and keeps evicted prefix blocks in; the slots'
// bookkeeping is src/kv/host_tier.h. Not the KV in host memory (-nkvo, kv_in_host_memory.h: the
// GPU layers' whole KV pool) nor the streamed weights (streamed_weights.h).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace ember {

// Each layer's slots are laid out as the layer's KV pool, so a block copies to a slot as one
// range. One allocation per backend, from its alloc_host (CUDA: pinned, so the copies run at full
// speed), or plain heap memory, with one warning, when that fails.
class HostTierMemory {
public:
    HostTierMemory() = default;
    HostTierMemory(const HostTierMemory&) = delete;
    HostTierMemory& operator=(const HostTierMemory&) = delete;
    ~HostTierMemory();
    // kv_bytes[l]: one slot's K and V bytes of layer l, on backend be[l]. Throws OutOfMemory
    // naming kv_host_mb when host memory runs out.
    void allocate(const std::vector<Backend*>& be, const std::vector<std::pair<size_t, size_t>>& kv_bytes,
                  int32_t n_slots);
    int32_t n_slots() const { return n_slots_; }
    uint8_t* k(int32_t l) const { return k_[l]; }
    uint8_t* v(int32_t l) const { return v_[l]; }

private:
    struct Chunk {
        Backend* be;
        void* p;
        bool pinned;   // from be->alloc_host, else ::operator new
    };
    std::vector<Chunk> chunks_;
    std::vector<uint8_t*> k_, v_;
    int32_t n_slots_ = 0;
};

}  // namespace ember
