// Free list + refcounts for paged-KV blocks; block tables grow and shrink by whole blocks.
#include "kv/block_allocator.h"

#include <cassert>

#include "ember/status.h"

namespace ember {

BlockAllocator::BlockAllocator(int32_t n_blocks) : refs_(n_blocks, 0) {
    free_.reserve(n_blocks);
    // Hand out low ids first (pop from the back).
    for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockAllocator::allocate() {
    if (free_.empty()) fail("KV cache is full: all ", refs_.size(), " blocks are in use");
    const int32_t b = free_.back();
    free_.pop_back();
    refs_[b] = 1;
    return b;
}

void BlockAllocator::retain(int32_t block) {
    assert(refs_[block] > 0);
    ++refs_[block];
}

void BlockAllocator::release(int32_t block) {
    assert(refs_[block] > 0);
    if (--refs_[block] == 0) free_.push_back(block);
}

void BlockTable::reserve_tokens(int32_t n_tokens) {
    const size_t need = (size_t)((n_tokens + block_size_ - 1) / block_size_);
    while (blocks_.size() < need) blocks_.push_back(alloc_.allocate());
}

void BlockTable::truncate(int32_t n_tokens) {
    const size_t keep = (size_t)((n_tokens + block_size_ - 1) / block_size_);
    while (blocks_.size() > keep) {
        alloc_.release(blocks_.back());
        blocks_.pop_back();
    }
}

}  // namespace ember
