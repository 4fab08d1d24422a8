// The sequences of a paged KV cache: one block table per sequence over a shared BlockPool, the
// token ids whose KV each sequence holds (for the prefix cache), and the sequence operations
// (add, remove, truncate, fork with copy on write, prefix matching). Bookkeeping only: copying a
// block's bytes is the copy_block callback's job (KVStorage::copy_block).
#pragma once
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace ember {

class KVCache {
public:
    // Copies every layer's bytes of block `src` to block `dst`.
    using CopyBlock = std::function<void(int32_t src, int32_t dst)>;

    // salt: what besides the tokens decides a block's bytes (block_key's salt: the KV types).
    // prefix_caching false: no block is ever published or looked up.
    KVCache(int32_t n_blocks, int32_t block_size, uint64_t salt, bool prefix_caching, CopyBlock copy_block);

    // A new empty sequence; throws InvalidInput if `seq` exists.
    void add(int64_t seq);
    // Releases every block of `seq` (published full blocks stay cached); no-op if unknown.
    void remove(int64_t seq);
    bool has(int64_t seq) const;
    // For an empty sequence: maps the cached full blocks that hold the longest prefix of
    // tokens[0..n) (block by block: key of block i chains block i-1's key), at most
    // (n - 1) / block_size blocks so that at least one token is left to compute. Returns the
    // number of tokens now in the cache for `seq` (a multiple of block_size).
    int32_t match_prefix(int64_t seq, const int32_t* tokens, int32_t n);
    // Makes room to write positions n_tokens(seq) .. n_tokens(seq) + n - 1: allocates blocks, and
    // first copies (copy on write) the block the first write lands in if it is shared (refcount
    // > 1), or unpublishes it if it is published. Returns false, with nothing allocated, when the
    // pool has too few available blocks.
    bool reserve(int64_t seq, int32_t n);
    // Blocks reserve(seq, n) would take from the pool (new blocks plus a copy on write).
    int32_t blocks_needed(int64_t seq, int32_t n) const;
    // The KV of tokens[0..n) is now written at positions n_tokens(seq)...: appends them to the
    // sequence and publishes every block this fills (prefix caching on).
    void commit(int64_t seq, const int32_t* tokens, int32_t n);
    // Forgets positions >= n_tokens (blocks wholly past it released).
    void truncate(int64_t seq, int32_t n_tokens);
    // dst (new) gets src's tokens: src's full blocks shared (refcount + 1), its partial last
    // block copied into a new block. Returns false, with dst not created, if no block is left
    // for that copy.
    bool fork(int64_t src, int64_t dst);

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
    };
    Sequence& seq_of(int64_t seq, const char* fn);
    const Sequence& seq_of(int64_t seq, const char* fn) const;
    int64_t blocks_for(int64_t n_tok) const { return (n_tok + block_size_ - 1) / block_size_; }
    int32_t first_write_block(const Sequence& s) const;
    int32_t needed_for(const Sequence& s, int32_t n) const;
    int32_t copy_of(int32_t block);
    void publish_full_blocks(Sequence& s);
    void release_tail(Sequence& s, size_t keep);

    int32_t block_size_;
    uint64_t salt_;
    bool prefix_caching_;
    CopyBlock copy_block_;
    BlockPool pool_;
    std::unordered_map<int64_t, Sequence> seqs_;
};

}  // namespace ember
