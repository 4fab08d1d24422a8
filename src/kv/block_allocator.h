// Paged-KV bookkeeping: a pool of fixed-size token blocks with refcounts (so sequences can share
// a prefix) and per-sequence block tables. Storage itself lives in each backend's KVLayer.
#pragma once
#include <cstdint>
#include <vector>

namespace ember {

class BlockAllocator {
public:
    explicit BlockAllocator(int32_t n_blocks);
    int32_t allocate();             // throws InvalidInput when the pool is exhausted
    void retain(int32_t block);
    void release(int32_t block);    // back to the free list when the last reference goes
    int32_t n_free() const { return (int32_t)free_.size(); }
    int32_t n_blocks() const { return (int32_t)refs_.size(); }

private:
    std::vector<int32_t> refs_;
    std::vector<int32_t> free_;
};

// The blocks holding one sequence's KV, in position order: position p is in blocks[p / block_size].
class BlockTable {
public:
    BlockTable(BlockAllocator& alloc, int32_t block_size) : alloc_(alloc), block_size_(block_size) {}
    ~BlockTable() { truncate(0); }
    void reserve_tokens(int32_t n_tokens);   // grows the table to hold n_tokens positions
    void truncate(int32_t n_tokens);         // releases blocks past n_tokens positions
    const std::vector<int32_t>& blocks() const { return blocks_; }

private:
    BlockAllocator& alloc_;
    int32_t block_size_;
    std::vector<int32_t> blocks_;
};

}  // namespace ember
