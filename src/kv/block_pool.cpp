// The block pool's state machine (free / used / cached), its O(1) LRU of cached blocks, the
// prefix-cache key map, and block_key, the chained content hash that names a full block.
#include "kv/block_pool.h"

#include <cassert>

#include "ember/status.h"

namespace ember {

namespace {

// xxHash64's primes and round/avalanche shapes: every input bit reaches every output bit, which
// matters because keys of different prompts share a map and a collision would map wrong KV.
constexpr uint64_t P1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t P2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t P3 = 0x165667B19E3779F9ull;
constexpr uint64_t P5 = 0x27D4EB2F165667C5ull;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t round_in(uint64_t acc, uint64_t v) { return rotl(acc + v * P2, 31) * P1; }

uint64_t avalanche(uint64_t h) {
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

}  // namespace

uint64_t block_key(uint64_t parent, const int32_t* tokens, int32_t n, uint64_t salt) {
    if (n < 0) fail("block_key: n must be >= 0, got ", n);
    uint64_t h = round_in(P5, parent);
    h = round_in(h, salt);
    h = round_in(h, (uint64_t)n);
    // Two tokens per round: half the multiplies; for a given acc a round is a bijection of its
    // input, so two different pairs never meet in one round (n, mixed in above, tells a lone
    // last token from a pair ending in 0).
    int32_t i = 0;
    for (; i + 1 < n; i += 2)
        h = round_in(h, (uint64_t)(uint32_t)tokens[i] | ((uint64_t)(uint32_t)tokens[i + 1] << 32));
    if (i < n) h = round_in(h, (uint64_t)(uint32_t)tokens[i]);
    return avalanche(h);
}

BlockPool::BlockPool(int32_t n_blocks) {
    if (n_blocks <= 0) fail("BlockPool: n_blocks must be > 0, got ", n_blocks);
    refs_.assign(n_blocks, 0);
    key_.assign(n_blocks, 0);
    has_key_.assign(n_blocks, 0);
    lru_ = LruList(n_blocks);
    // allocate() hands out 0, 1, 2... first: easier to read in tests and dumps.
    free_ = free_stack(n_blocks);
}

void BlockPool::check_block(int32_t block, const char* fn) const {
    if (block < 0 || block >= n_blocks())
        fail("BlockPool.", fn, ": block ", block, " out of range [0, ", n_blocks(), ")");
}

void BlockPool::drop_key(int32_t block) {
    by_key_.erase(key_[block]);
    has_key_[block] = 0;
}

int32_t BlockPool::allocate() {
    int32_t b;
    if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
    } else if (!lru_.empty()) {
        b = lru_.oldest();
        const uint64_t key = key_[b];
        lru_.remove(b);
        drop_key(b);
        ++evictions_;
        if (evict_hook_) evict_hook_(b, key);
    } else {
        return -1;
    }
    assert(refs_[b] == 0 && !has_key_[b]);
    refs_[b] = 1;
    return b;
}

void BlockPool::retain(int32_t block) {
    check_block(block, "retain");
    // A block at refcount 0 may already be someone else's (free) or only findable by key
    // (cached): only allocate() and lookup() may bring it back.
    if (refs_[block] == 0) fail("BlockPool.retain: block ", block, " is not in use");
    ++refs_[block];
}

void BlockPool::release(int32_t block) {
    check_block(block, "release");
    if (refs_[block] == 0) fail("BlockPool.release: block ", block, " is not in use");
    if (--refs_[block] > 0) return;
    if (has_key_[block]) {
        lru_.push_newest(block);
    } else {
        free_.push_back(block);
    }
}

int32_t BlockPool::lookup(uint64_t key) {
    ++lookups_;
    const int32_t b = acquire(key);
    if (b >= 0) ++hits_;
    return b;
}

int32_t BlockPool::acquire(uint64_t key) {
    const int32_t b = find(key);
    if (b < 0) return -1;
    if (refs_[b] == 0) lru_.remove(b);
    ++refs_[b];
    return b;
}

int32_t BlockPool::find(uint64_t key) const {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? -1 : it->second;
}

void BlockPool::publish(int32_t block, uint64_t key) {
    check_block(block, "publish");
    // Only an in-use block may gain a key: a free one's bytes are nobody's.
    if (refs_[block] == 0) fail("BlockPool.publish: block ", block, " is not in use");
    if (has_key_[block]) {
        if (key_[block] == key) return;
        fail("BlockPool.publish: block ", block, " is already published under another key");
    }
    if (!by_key_.emplace(key, block).second) return;
    key_[block] = key;
    has_key_[block] = 1;
}

void BlockPool::unpublish(int32_t block) {
    check_block(block, "unpublish");
    if (!has_key_[block]) return;
    drop_key(block);
    if (refs_[block] == 0) {
        lru_.remove(block);
        free_.push_back(block);
    }
}

bool BlockPool::published(int32_t block) const {
    check_block(block, "published");
    return has_key_[block] != 0;
}

int32_t BlockPool::refs(int32_t block) const {
    check_block(block, "refs");
    return refs_[block];
}

int32_t BlockPool::n_available() const { return (int32_t)(free_.size() + lru_.size()); }

BlockPoolStats BlockPool::stats() const {
    BlockPoolStats s;
    s.n_blocks = n_blocks();
    s.n_free = (int32_t)free_.size();
    s.n_cached = (int32_t)lru_.size();
    s.n_used = s.n_blocks - s.n_free - s.n_cached;
    s.lookups = lookups_;
    s.hits = hits_;
    s.evictions = evictions_;
    return s;
}

void BlockPool::clear_cache() {
    for (int32_t b : lru_) {
        drop_key(b);
        free_.push_back(b);
    }
    lru_.clear();
}

}  // namespace ember
