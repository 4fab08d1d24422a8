// The sequence operations of the paged KV cache over one BlockPool: block tables, publishing full
// blocks, matching cached prefixes (device, then host tier), and swapping sequences out to the
// host tier and back with their copies queued per step.
#include "kv/kv_cache.h"

#include <algorithm>
#include <cassert>

#include "ember/status.h"

namespace ember {

KVCache::KVCache(int32_t n_blocks, int32_t block_size, uint64_t salt, bool prefix_caching)
    : block_size_(block_size), salt_(salt), prefix_caching_(prefix_caching), pool_(n_blocks) {
    if (block_size <= 0) fail("KVCache: block_size must be > 0, got ", block_size);
}

KVCache::Sequence& KVCache::seq_of(int64_t seq, const char* fn) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) fail("KVCache.", fn, ": unknown sequence ", seq);
    return it->second;
}

const KVCache::Sequence& KVCache::seq_of(int64_t seq, const char* fn) const {
    return const_cast<KVCache*>(this)->seq_of(seq, fn);
}

KVCache::Sequence& KVCache::resident(int64_t seq, const char* fn) {
    Sequence& s = seq_of(seq, fn);
    if (s.swapped) fail("KVCache.", fn, ": sequence ", seq, " is swapped out (swap_in first)");
    return s;
}

void KVCache::publish_full_blocks(Sequence& s) {
    size_t n_full = s.tokens.size() / (size_t)block_size_;
    for (size_t i = s.keys.size(); i < n_full; ++i) {
        uint64_t parent = i ? s.keys[i - 1] : 0;
        uint64_t key = block_key(parent, s.tokens.data() + i * block_size_, block_size_, salt_);
        s.keys.push_back(key);
        pool_.publish(s.blocks[i], key);
    }
}

// Last block first: with chained keys a cached block is only reachable through its parents, so
// the tail of a prefix should be evicted before its head.
void KVCache::release_tail(Sequence& s, size_t keep) {
    while (s.blocks.size() > keep) {
        pool_.release(s.blocks.back());
        s.blocks.pop_back();
    }
}

void KVCache::add(int64_t seq) {
    if (!seqs_.emplace(seq, Sequence{}).second) fail("KVCache.add: sequence ", seq, " already exists");
}

void KVCache::remove(int64_t seq) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    release_tail(it->second, 0);
    for (int32_t slot : it->second.host_slots) host_->give_back(slot);
    seqs_.erase(it);
}

bool KVCache::has(int64_t seq) const { return seqs_.count(seq) != 0; }

int32_t KVCache::match_prefix(int64_t seq, const int32_t* tokens, int32_t n) {
    Sequence& s = resident(seq, "match_prefix");
    if (n < 0) fail("KVCache.match_prefix: sequence ", seq, ": n must be >= 0, got ", n);
    if (!s.tokens.empty() || !s.blocks.empty())
        fail("KVCache.match_prefix: sequence ", seq, " is not empty (", s.tokens.size(), " tokens, ", s.blocks.size(),
             " blocks)");
    if (!prefix_caching_ || n == 0) return 0;
    int32_t max_blocks = (n - 1) / block_size_;
    uint64_t parent = 0;
    for (int32_t i = 0; i < max_blocks; ++i) {
        const int32_t* block_tokens = tokens + (size_t)i * block_size_;
        uint64_t key = block_key(parent, block_tokens, block_size_, salt_);
        int32_t b = pool_.lookup(key);
        if (b < 0) b = host_hit(key);
        if (b < 0) break;
        s.blocks.push_back(b);
        s.keys.push_back(key);
        s.tokens.insert(s.tokens.end(), block_tokens, block_tokens + block_size_);
        parent = key;
    }
    return (int32_t)s.tokens.size();
}

int32_t KVCache::needed_for(const Sequence& s, int32_t n) const {
    if (s.swapped) {
        // Every block comes from the pool but those of its full blocks another sequence holds.
        int64_t held = 0;
        for (size_t i = 0; i < s.keys.size() && i < s.host_slots.size(); ++i) {
            const int32_t b = pool_.find(s.keys[i]);
            held += b >= 0 && pool_.refs(b) > 0;
        }
        return (int32_t)(blocks_for((int64_t)s.tokens.size() + n) - held);
    }
    return (int32_t)std::max<int64_t>(0, blocks_for((int64_t)s.tokens.size() + n) - (int64_t)s.blocks.size());
}

int32_t KVCache::blocks_needed(int64_t seq, int32_t n) const {
    const Sequence& s = seq_of(seq, "blocks_needed");
    if (n < 0) fail("KVCache.blocks_needed: sequence ", seq, ": n must be >= 0, got ", n);
    return needed_for(s, n);
}

bool KVCache::reserve(int64_t seq, int32_t n) {
    Sequence& s = resident(seq, "reserve");
    if (n < 0) fail("KVCache.reserve: sequence ", seq, ": n must be >= 0, got ", n);
    if (needed_for(s, n) > pool_.n_available()) return false;
    int64_t total = blocks_for((int64_t)s.tokens.size() + n);
    while ((int64_t)s.blocks.size() < total) {
        int32_t b = pool_.allocate();
        assert(b >= 0);  // counted in needed_for
        s.blocks.push_back(b);
    }
    return true;
}

void KVCache::commit(int64_t seq, const int32_t* tokens, int32_t n) {
    Sequence& s = resident(seq, "commit");
    if (n < 0) fail("KVCache.commit: sequence ", seq, ": n must be >= 0, got ", n);
    if (n == 0) return;
    size_t capacity = s.blocks.size() * (size_t)block_size_;
    if (s.tokens.size() + (size_t)n > capacity)
        fail("KVCache.commit: sequence ", seq, ": ", n, " tokens at position ", s.tokens.size(), " exceed the ",
             capacity, " reserved positions (call reserve first)");
    // The write landed in this sequence's own blocks: full blocks are the only shared or published
    // ones, and truncate unpublishes the block it cuts into and refuses to cut into a shared one.
    assert(pool_.refs(s.blocks[s.tokens.size() / (size_t)block_size_]) == 1);
    assert(!pool_.published(s.blocks[s.tokens.size() / (size_t)block_size_]));
    s.tokens.insert(s.tokens.end(), tokens, tokens + n);
    if (prefix_caching_) publish_full_blocks(s);
}

void KVCache::truncate(int64_t seq, int32_t n_tokens) {
    Sequence& s = resident(seq, "truncate");
    if (n_tokens < 0 || (size_t)n_tokens > s.tokens.size())
        fail("KVCache.truncate: sequence ", seq, ": n_tokens must be in [0, ", s.tokens.size(), "], got ", n_tokens);
    const size_t cut = (size_t)n_tokens / block_size_;   // the block the next write lands in
    const bool inside = n_tokens % block_size_ != 0;
    if (inside && pool_.refs(s.blocks[cut]) > 1)
        fail("KVCache.truncate: sequence ", seq, ": position ", n_tokens, " falls inside block ", s.blocks[cut],
             ", which ", pool_.refs(s.blocks[cut]) - 1,
             " other sequence(s) share; blocks are never copied, so "
             "truncate to a multiple of block_size ",
             block_size_, " there");
    release_tail(s, (size_t)blocks_for(n_tokens));
    s.tokens.resize(n_tokens);
    s.keys.resize(std::min(s.keys.size(), cut));
    // Its rows past the cut will be overwritten: nobody may find it by its old key.
    if (inside && pool_.published(s.blocks[cut])) pool_.unpublish(s.blocks[cut]);
}

void KVCache::enable_host_tier(int32_t n_slots, HostCopy to_host, HostCopy from_host) {
    if (host_) fail("KVCache.enable_host_tier: the cache has a host tier already");
    if (n_slots <= 0) fail("KVCache.enable_host_tier: n_slots must be > 0, got ", n_slots);
    if (!to_host || !from_host) fail("KVCache.enable_host_tier: both copy callbacks are needed");
    host_ = std::make_unique<HostTier>(n_slots);
    to_host_copy_ = std::move(to_host);
    from_host_copy_ = std::move(from_host);
    pool_.set_evict_hook([this](int32_t block, uint64_t key) { on_evict(block, key); });
}

void KVCache::on_evict(int32_t block, uint64_t key) {
    // A block a queued copy from the host is still to fill holds nothing yet; its content is in
    // that copy's slot (a host hit's slot stays cached under this key).
    if (incoming_.count(block)) return;
    const int32_t slot = host_->store(key);
    if (slot >= 0) to_host_.emplace_back(block, slot);
}

int32_t KVCache::host_hit(uint64_t key) {
    // Checked first: a hit with no block to copy into would be counted and lost.
    if (!host_ || pool_.n_available() == 0) return -1;
    const int32_t slot = host_->lookup(key);
    if (slot < 0) return -1;
    const int32_t b = pool_.allocate();
    from_host_.emplace_back(slot, b);
    incoming_.insert(b);
    pool_.publish(b, key);
    return b;
}

bool KVCache::swap_out(int64_t seq) {
    Sequence& s = resident(seq, "swap_out");
    if (!host_) return false;
    const size_t n = (size_t)blocks_for((int64_t)s.tokens.size());
    // A block still waiting for its bytes from the host cannot be copied out before they land.
    if (std::any_of(s.blocks.begin(), s.blocks.begin() + n, [&](int32_t b) { return incoming_.count(b) != 0; }))
        flush_host_copies();
    std::vector<int32_t> slots = host_->take((int32_t)n);
    if (slots.size() != n) return false;
    for (size_t i = 0; i < n; ++i) to_host_.emplace_back(s.blocks[i], slots[i]);
    release_tail(s, 0);
    s.host_slots = std::move(slots);
    s.swapped = true;
    return true;
}

bool KVCache::swap_in(int64_t seq) {
    Sequence& s = seq_of(seq, "swap_in");
    if (!s.swapped) fail("KVCache.swap_in: sequence ", seq, " is not swapped out");
    if (needed_for(s, 0) > pool_.n_available()) return false;
    const size_t n = s.host_slots.size();
    // Full blocks the prefix cache still holds first, so that allocating the others cannot evict them.
    s.blocks.assign(n, -1);
    for (size_t i = 0; i < n && i < s.keys.size(); ++i) s.blocks[i] = pool_.acquire(s.keys[i]);
    for (size_t i = 0; i < n; ++i) {
        const int32_t slot = s.host_slots[i];
        if (s.blocks[i] < 0) {
            const int32_t b = pool_.allocate();
            assert(b >= 0);  // counted in needed_for
            s.blocks[i] = b;
            from_host_.emplace_back(slot, b);
            incoming_.insert(b);
            host_->pin(slot);
            if (i < s.keys.size()) pool_.publish(b, s.keys[i]);
        }
        host_->give_back(slot);
    }
    s.host_slots.clear();
    s.swapped = false;
    return true;
}

bool KVCache::swapped(int64_t seq) const { return seq_of(seq, "swapped").swapped; }

void KVCache::flush_host_copies() {
    if (!host_) return;
    // Taken first: a copy that throws is not run again by the next flush.
    BlockPairs out, in;
    out.swap(to_host_);
    in.swap(from_host_);
    incoming_.clear();
    if (!out.empty()) to_host_copy_(out);
    if (!in.empty()) from_host_copy_(in);
    host_->end_step();
}

int32_t KVCache::n_tokens(int64_t seq) const { return (int32_t)seq_of(seq, "n_tokens").tokens.size(); }

const std::vector<int32_t>& KVCache::blocks(int64_t seq) const { return seq_of(seq, "blocks").blocks; }

const std::vector<int32_t>& KVCache::tokens(int64_t seq) const { return seq_of(seq, "tokens").tokens; }

}  // namespace ember
