// Recurrent state snapshots keyed by prefix (state_snapshots.h).
#include "engine/state_snapshots.h"

#include "ember/status.h"
#include "kv/block_pool.h"

namespace ember {

StateSnapshots::StateSnapshots(int32_t every, int32_t block_size, size_t max_bytes)
    : every_(every), block_size_(block_size), max_bytes_(max_bytes) {
    if (every < 0) fail("state_snapshot_interval must be >= 0 (0: no snapshots), got ", every);
    if (every > 0 && every % block_size != 0)
        fail("state_snapshot_interval ", every, " must be a multiple of kv_block_size ", block_size);
}

uint64_t StateSnapshots::key(const int32_t* tokens, int32_t pos) const {
    uint64_t k = 0;
    for (int32_t at = 0; at < pos; at += block_size_) k = block_key(k, tokens + at, block_size_, 0);
    return k;
}

void StateSnapshots::put(uint64_t key, std::vector<float> state) {
    const size_t bytes = state.size() * sizeof(float);
    if (!enabled() || bytes > max_bytes_) return;
    if (auto it = map_.find(key); it != map_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        return;
    }
    while (bytes_ + bytes > max_bytes_) {
        auto old = map_.find(lru_.back());
        bytes_ -= old->second.state->size() * sizeof(float);
        map_.erase(old);
        lru_.pop_back();
    }
    lru_.push_front(key);
    map_.emplace(key, Entry{std::make_shared<const std::vector<float>>(std::move(state)), lru_.begin()});
    bytes_ += bytes;
}

std::pair<int32_t, StateSnapshots::State> StateSnapshots::longest(const int32_t* tokens, int32_t n) {
    std::pair<int32_t, State> best{0, nullptr};
    if (!enabled()) return best;
    uint64_t k = 0;
    for (int32_t pos = block_size_; pos <= n; pos += block_size_) {
        k = block_key(k, tokens + pos - block_size_, block_size_, 0);
        if (pos % every_ != 0) continue;
        auto it = map_.find(k);
        if (it == map_.end()) continue;
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        best = {pos, it->second.state};
    }
    return best;
}

}  // namespace ember
