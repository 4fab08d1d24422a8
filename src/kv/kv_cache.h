// The sequences of a paged KV cache: one block table per sequence over a shared BlockPool, the
// token ids whose KV each sequence holds (for the prefix cache), and the sequence operations
// (add, remove, truncate, prefix matching, swapping out to the host tier and back). Sequences
// share full blocks only (prefix matching), as vLLM's v1 cache does: the block a sequence writes
// next is always its own, so no block is ever copied on the device. Bookkeeping only: the host
// tier's copies are the callbacks' job (Runner::copy_blocks_to_host / copy_blocks_from_host).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "kv/host_tier.h"

namespace ember {

class KVCache {
public:
    // Copies between the pool and the host tier, as (from, to) pairs: (device block, host slot)
    // out to the host, (host slot, device block) back from it.
    using BlockPairs = std::vector<std::pair<int32_t, int32_t>>;
    using HostCopy = std::function<void(const BlockPairs& pairs)>;

    // salt: what besides the tokens decides a block's bytes (block_key's salt: the KV types).
    // prefix_caching false: no block is ever published or looked up.
    KVCache(int32_t n_blocks, int32_t block_size, uint64_t salt, bool prefix_caching);
    // Not copied or moved: its pool's evict hook points back at it.
    KVCache(const KVCache&) = delete;
    KVCache& operator=(const KVCache&) = delete;

    // A new empty sequence; throws InvalidInput if `seq` exists.
    void add(int64_t seq);
    // Releases every block of `seq` (published full blocks stay cached) or, swapped out, its host
    // slots; no-op if unknown.
    void remove(int64_t seq);
    bool has(int64_t seq) const;
    // For an empty sequence: maps the cached full blocks that hold the longest prefix of
    // tokens[0..n) (block by block: key of block i chains block i-1's key), at most
    // (n - 1) / block_size blocks so that at least one token is left to compute. A block missing
    // from the pool but kept by the host tier gets a new block, published again, with its copy
    // from the host queued. Returns the number of tokens now in the cache for `seq` (a multiple of
    // block_size).
    int32_t match_prefix(int64_t seq, const int32_t* tokens, int32_t n);
    // Makes room to write positions n_tokens(seq) .. n_tokens(seq) + n - 1: allocates blocks.
    // Returns false, with nothing allocated, when the pool has too few available blocks.
    bool reserve(int64_t seq, int32_t n);
    // Blocks reserve(seq, n) would take from the pool; for a swapped-out sequence, swap_in and
    // then reserve(seq, n) together.
    int32_t blocks_needed(int64_t seq, int32_t n) const;
    // The KV of tokens[0..n) is now written at positions n_tokens(seq)...: appends them to the
    // sequence and publishes every block this fills (prefix caching on).
    void commit(int64_t seq, const int32_t* tokens, int32_t n);
    // Forgets positions >= n_tokens (blocks wholly past it released). A cut inside a block
    // unpublishes it (its rows past the cut will be overwritten); a cut inside a block other
    // sequences share throws InvalidInput, nothing changed, since the cache never copies a block.
    void truncate(int64_t seq, int32_t n_tokens);

    // A host tier of n_slots block-sized slots (n_slots > 0): sequences may be swapped out to it,
    // and the blocks the prefix cache evicts are kept there and found again by match_prefix.
    // Copies are queued and run by flush_host_copies().
    void enable_host_tier(int32_t n_slots, HostCopy to_host, HostCopy from_host);
    // Copies the sequence's blocks out to host slots of its own and releases its device blocks
    // (published full blocks stay cached); it keeps its tokens. False, with nothing changed,
    // without a host tier or when the tier has too few slots left.
    bool swap_out(int64_t seq);
    // Brings a swapped-out sequence back: full blocks still in the prefix cache are mapped again,
    // the others get new blocks copied back from its slots, which it gives up. False, with nothing
    // changed, when the pool has too few available blocks (blocks_needed(seq, 0)).
    bool swap_in(int64_t seq);
    bool swapped(int64_t seq) const;
    // Runs the queued copies, every one to the host before any from it (a block evicted to the
    // host may be the one a host hit is copied into), then lets the slots they read be reused.
    // Device writes must wait for it: the engine calls it after planning a step, before the
    // forward.
    void flush_host_copies();
    bool host_copies_pending() const { return !to_host_.empty() || !from_host_.empty(); }
    const HostTier* host_tier() const { return host_.get(); }

    int32_t n_tokens(int64_t seq) const;
    const std::vector<int32_t>& blocks(int64_t seq) const;
    const std::vector<int32_t>& tokens(int64_t seq) const;
    int32_t block_size() const { return block_size_; }
    const BlockPool& pool() const { return pool_; }
    BlockPool& pool() { return pool_; }
    size_t n_sequences() const { return seqs_.size(); }

private:
    struct Sequence {
        std::vector<int32_t> blocks;
        std::vector<int32_t> tokens;
        std::vector<uint64_t> keys;   // content key of each full block (chained)
        bool swapped = false;
        std::vector<int32_t> host_slots;   // swapped out: block i's bytes are in host_slots[i]
    };
    Sequence& seq_of(int64_t seq, const char* fn);
    const Sequence& seq_of(int64_t seq, const char* fn) const;
    Sequence& resident(int64_t seq, const char* fn);   // seq_of, failing for a swapped-out one
    void on_evict(int32_t block, uint64_t key);
    int32_t host_hit(uint64_t key);   // a new block that the host copy of `key` is queued into
    int64_t blocks_for(int64_t n_tok) const { return (n_tok + block_size_ - 1) / block_size_; }
    int32_t needed_for(const Sequence& s, int32_t n) const;
    void publish_full_blocks(Sequence& s);
    void release_tail(Sequence& s, size_t keep);

    int32_t block_size_;
    uint64_t salt_;
    bool prefix_caching_;
    BlockPool pool_;
    std::unordered_map<int64_t, Sequence> seqs_;
    std::unique_ptr<HostTier> host_;
    HostCopy to_host_copy_, from_host_copy_;
    BlockPairs to_host_, from_host_;          // queued until flush_host_copies()
    std::unordered_set<int32_t> incoming_;    // device blocks a queued copy from the host writes
};

}  // namespace ember
