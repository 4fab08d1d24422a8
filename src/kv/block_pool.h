// The paged-KV block pool: refcounted blocks of a fixed token count, a free list, and the prefix
// cache. A full block may be published under a content key (block_key: its parent's key and its
// tokens); when its last reference goes it stays findable, in LRU order, until allocate() needs
// it. Bookkeeping only: the bytes live in KVStorage.
#pragma once
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "kv/lru_list.h"

namespace ember {

// The content key of a full block: a hash of the parent block's key (0 for the first block of a
// sequence), the block's token ids and a salt naming what else decides its bytes (KV types).
uint64_t block_key(uint64_t parent, const int32_t* tokens, int32_t n, uint64_t salt);

struct BlockPoolStats {
    int32_t n_blocks = 0;
    int32_t n_used = 0;        // refcount > 0
    int32_t n_cached = 0;      // refcount 0 but published: findable until reused
    int32_t n_free = 0;        // refcount 0 and not published
    int64_t lookups = 0;       // lookup() calls
    int64_t hits = 0;          // lookup() calls that found a block
    int64_t evictions = 0;     // cached blocks reused by allocate()
};

class BlockPool {
public:
    // Told of each cached block allocate() is about to reuse, with the key it held, while its
    // bytes are still whole (the host tier keeps a copy).
    using EvictHook = std::function<void(int32_t block, uint64_t key)>;

    explicit BlockPool(int32_t n_blocks);
    // A block with refcount 1: an unpublished free one first, else the least recently released
    // cached one (its key is dropped, the evict hook told); -1 when every block is in use.
    int32_t allocate();
    void set_evict_hook(EvictHook hook) { evict_hook_ = std::move(hook); }
    void retain(int32_t block);
    // At refcount 0 a published block joins the cached LRU list (most recent last), any other
    // goes back to the free list.
    void release(int32_t block);
    // The block published under `key`, retained (taken off the LRU list if cached); -1 if none.
    int32_t lookup(uint64_t key);
    // lookup() for the cache's own bookkeeping (a swapped-in sequence taking back its blocks),
    // not counted as a prefix-cache query.
    int32_t acquire(uint64_t key);
    // The block published under `key`, or -1; changes nothing.
    int32_t find(uint64_t key) const;
    // Records that `block` (in use, full) holds the content `key`. If another block already
    // holds `key`, nothing changes (the first stays the one found). A block has at most one key.
    void publish(int32_t block, uint64_t key);
    // Forgets the key of `block` (about to be overwritten in place).
    void unpublish(int32_t block);
    bool published(int32_t block) const;
    int32_t refs(int32_t block) const;
    // Blocks allocate() can hand out now: free + cached.
    int32_t n_available() const;
    int32_t n_blocks() const { return (int32_t)refs_.size(); }
    BlockPoolStats stats() const;
    // Drops every cached block's key (cached blocks become free).
    void clear_cache();

private:
    void check_block(int32_t block, const char* fn) const;
    void drop_key(int32_t block);

    // A block is in exactly one state: used (refs_ > 0), cached (refs_ 0, published, on lru_) or
    // free (refs_ 0, unpublished, on free_).
    std::vector<int32_t> refs_;
    std::vector<uint64_t> key_;                      // valid where has_key_
    std::vector<uint8_t> has_key_;
    std::unordered_map<uint64_t, int32_t> by_key_;
    std::vector<int32_t> free_;                      // a stack: allocate() pops the back
    LruList lru_;                                    // cached blocks, least recently released first
    int64_t lookups_ = 0;
    int64_t hits_ = 0;
    int64_t evictions_ = 0;
    EvictHook evict_hook_;
};

}  // namespace ember
