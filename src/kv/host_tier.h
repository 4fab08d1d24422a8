// The host tier of the paged KV cache (kv_host_mb; vLLM's swap space): a second pool of
// block-sized slots in host memory. A slot is free, owned (it holds a block of a sequence swapped
// out of the device pool) or cached (it holds a block the device prefix cache evicted, findable by
// the same content key, in LRU order). Owned slots take priority: taking slots for a swap drops
// the coldest cached ones. Bookkeeping only: the bytes live in src/model/host_tier_memory.h. Not
// the KV in host memory (-nkvo, src/model/kv_in_host_memory.h: the GPU layers' whole pool kept in
// host memory) nor the streamed weights (src/model/streamed_weights.h).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kv/lru_list.h"

namespace ember {

struct HostTierStats {
    int32_t n_slots = 0;
    int32_t n_used = 0;     // owned by swapped-out sequences
    int32_t n_cached = 0;   // holding an evicted prefix-cache block
    int32_t n_free = 0;
    int64_t lookups = 0;    // lookup() calls
    int64_t hits = 0;       // lookup() calls that found a slot
    int64_t stores = 0;     // blocks store() gave a slot
};

class HostTier {
public:
    explicit HostTier(int32_t n_slots);
    // n owned slots (free ones first, then cached ones, least recently used first); empty, with
    // nothing changed, when fewer than n can be had.
    std::vector<int32_t> take(int32_t n);
    // Slots take() could hand out now: free + cached, less the cached ones pinned this step.
    int32_t n_available() const;
    // Ends the ownership of a slot from take(). A slot pinned this step becomes free at end_step().
    void give_back(int32_t slot);
    // A slot to copy the block of content `key` into, now cached under `key` (most recent): a free
    // one, else the least recently used cached one. -1 when `key` is cached already (it becomes
    // the most recent) or every slot is owned or pinned.
    int32_t store(uint64_t key);
    // The cached slot holding `key`, made the most recent and pinned; -1 if none.
    int32_t lookup(uint64_t key);
    // Keeps `slot` from being reused until end_step(): a copy out of it is still pending.
    void pin(int32_t slot);
    // The step's pending copies are done: pinned slots may be reused, given-back ones are free.
    void end_step();
    // Drops every cached key (cached slots become free).
    void clear_cache();
    int32_t n_slots() const { return (int32_t)state_.size(); }
    HostTierStats stats() const;

private:
    enum class State : uint8_t { free, owned, cached };
    void check_slot(int32_t slot, const char* fn) const;
    void drop(int32_t slot);        // a cached slot loses its key and leaves the LRU list
    int32_t coldest_unpinned() const;
    void to_free(int32_t slot);

    std::vector<State> state_;
    std::vector<uint8_t> pinned_;
    std::vector<int32_t> pinned_list_;
    std::vector<int32_t> free_;              // a stack: take() and store() pop the back
    std::vector<int32_t> released_;          // given back while pinned: free at end_step()
    std::vector<uint64_t> key_;              // valid where cached
    std::unordered_map<uint64_t, int32_t> by_key_;
    LruList lru_;                            // cached slots, least recently used first
    int32_t n_owned_ = 0;
    int32_t n_pinned_cached_ = 0;
    int64_t lookups_ = 0, hits_ = 0, stores_ = 0;
};

}  // namespace ember
