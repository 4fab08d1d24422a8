// The sequence operations of the paged KV cache over one BlockPool: block tables, copy on write of
// shared blocks, publishing full blocks and matching cached prefixes.
#include "kv/kv_cache.h"

#include <algorithm>
#include <cassert>

#include "ember/status.h"

namespace ember {

KVCache::KVCache(int32_t n_blocks, int32_t block_size, uint64_t salt, bool prefix_caching, CopyBlock copy_block)
    : block_size_(block_size),
      salt_(salt),
      prefix_caching_(prefix_caching),
      copy_block_(std::move(copy_block)),
      pool_(n_blocks) {
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

// The next write lands in this table entry if it exists already; only that block can be shared
// or published, the ones after it are private reservations never committed.
int32_t KVCache::first_write_block(const Sequence& s) const {
    size_t i = s.tokens.size() / (size_t)block_size_;
    return i < s.blocks.size() ? (int32_t)i : -1;
}

// A new block holding a copy of `block`'s bytes, or -1 if the pool is exhausted.
int32_t KVCache::copy_of(int32_t block) {
    if (!copy_block_) fail("KVCache: block ", block, " must be copied but no copy_block callback was given");
    int32_t copy = pool_.allocate();
    if (copy < 0) return -1;
    try {
        copy_block_(block, copy);
    } catch (...) {
        pool_.release(copy);
        throw;
    }
    return copy;
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
    seqs_.erase(it);
}

bool KVCache::has(int64_t seq) const { return seqs_.count(seq) != 0; }

int32_t KVCache::match_prefix(int64_t seq, const int32_t* tokens, int32_t n) {
    Sequence& s = seq_of(seq, "match_prefix");
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
        if (b < 0) break;
        s.blocks.push_back(b);
        s.keys.push_back(key);
        s.tokens.insert(s.tokens.end(), block_tokens, block_tokens + block_size_);
        parent = key;
    }
    return (int32_t)s.tokens.size();
}

int32_t KVCache::needed_for(const Sequence& s, int32_t n) const {
    if (n == 0) return 0;
    int64_t fresh = std::max<int64_t>(0, blocks_for((int64_t)s.tokens.size() + n) - (int64_t)s.blocks.size());
    int32_t i = first_write_block(s);
    bool copy = i >= 0 && pool_.refs(s.blocks[i]) > 1;
    return (int32_t)fresh + (copy ? 1 : 0);
}

int32_t KVCache::blocks_needed(int64_t seq, int32_t n) const {
    const Sequence& s = seq_of(seq, "blocks_needed");
    if (n < 0) fail("KVCache.blocks_needed: sequence ", seq, ": n must be >= 0, got ", n);
    return needed_for(s, n);
}

bool KVCache::reserve(int64_t seq, int32_t n) {
    Sequence& s = seq_of(seq, "reserve");
    if (n < 0) fail("KVCache.reserve: sequence ", seq, ": n must be >= 0, got ", n);
    if (needed_for(s, n) > pool_.n_available()) return false;
    if (n == 0) return true;
    int32_t i = first_write_block(s);
    if (i >= 0) {
        int32_t b = s.blocks[i];
        if (pool_.refs(b) > 1) {
            int32_t copy = copy_of(b);
            assert(copy >= 0);  // counted in needed_for
            s.blocks[i] = copy;
            pool_.release(b);
        } else if (pool_.published(b)) {
            // Its bytes past n_tokens are about to change: nobody may find it by its old key.
            pool_.unpublish(b);
        }
    }
    int64_t total = blocks_for((int64_t)s.tokens.size() + n);
    while ((int64_t)s.blocks.size() < total) {
        int32_t b = pool_.allocate();
        assert(b >= 0);  // counted in needed_for
        s.blocks.push_back(b);
    }
    return true;
}

void KVCache::commit(int64_t seq, const int32_t* tokens, int32_t n) {
    Sequence& s = seq_of(seq, "commit");
    if (n < 0) fail("KVCache.commit: sequence ", seq, ": n must be >= 0, got ", n);
    if (n == 0) return;
    size_t capacity = s.blocks.size() * (size_t)block_size_;
    if (s.tokens.size() + (size_t)n > capacity)
        fail("KVCache.commit: sequence ", seq, ": ", n, " tokens at position ", s.tokens.size(), " exceed the ",
             capacity, " reserved positions (call reserve first)");
    int32_t first = s.blocks[s.tokens.size() / (size_t)block_size_];
    // The KV was written into `first`: had reserve not made it private, another sequence's (or
    // the cache's) bytes were just overwritten.
    if (pool_.refs(first) != 1 || pool_.published(first))
        fail("KVCache.commit: sequence ", seq, ": block ", first, " at position ", s.tokens.size(),
             " is shared or published (call reserve before writing)");
    s.tokens.insert(s.tokens.end(), tokens, tokens + n);
    if (prefix_caching_) publish_full_blocks(s);
}

void KVCache::truncate(int64_t seq, int32_t n_tokens) {
    Sequence& s = seq_of(seq, "truncate");
    if (n_tokens < 0 || (size_t)n_tokens > s.tokens.size())
        fail("KVCache.truncate: sequence ", seq, ": n_tokens must be in [0, ", s.tokens.size(), "], got ", n_tokens);
    // A partial last block stays published: its bytes are still whole until reserve() writes.
    release_tail(s, (size_t)blocks_for(n_tokens));
    s.tokens.resize(n_tokens);
    s.keys.resize(std::min(s.keys.size(), (size_t)n_tokens / block_size_));
}

bool KVCache::fork(int64_t src, int64_t dst) {
    const Sequence& s = seq_of(src, "fork");
    if (seqs_.count(dst)) fail("KVCache.fork: destination sequence ", dst, " already exists");
    size_t n_full = s.tokens.size() / (size_t)block_size_;
    Sequence d;
    d.tokens = s.tokens;
    d.keys = s.keys;
    d.blocks.assign(s.blocks.begin(), s.blocks.begin() + n_full);
    if (s.tokens.size() % block_size_) {
        int32_t copy = copy_of(s.blocks[n_full]);
        if (copy < 0) return false;
        d.blocks.push_back(copy);
    }
    for (size_t i = 0; i < n_full; ++i) pool_.retain(d.blocks[i]);
    seqs_.emplace(dst, std::move(d));
    return true;
}

int32_t KVCache::n_tokens(int64_t seq) const { return (int32_t)seq_of(seq, "n_tokens").tokens.size(); }

const std::vector<int32_t>& KVCache::blocks(int64_t seq) const { return seq_of(seq, "blocks").blocks; }

const std::vector<int32_t>& KVCache::tokens(int64_t seq) const { return seq_of(seq, "tokens").tokens; }

}  // namespace ember
