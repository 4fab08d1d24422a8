// The engine's copies of hybrid models' recurrent state at prefix boundaries: the state after the
// first `pos` tokens of a prompt, keyed by those tokens (the KV prefix cache's chained block keys),
// so a sequence whose prompt shares the prefix resumes from it instead of its first token. Host
// memory, bounded in bytes, least recently used dropped first.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

namespace ember {

class StateSnapshots {
public:
    using State = std::shared_ptr<const std::vector<float>>;

    // every: tokens between snapshots (a multiple of block_size; 0: none kept); max_bytes: their budget.
    StateSnapshots(int32_t every, int32_t block_size, size_t max_bytes);
    bool enabled() const { return every_ > 0 && max_bytes_ > 0; }
    int32_t every() const { return every_; }
    // Whether a sequence that has computed pos tokens should keep its state now.
    bool due(int32_t pos) const { return enabled() && pos > 0 && pos % every_ == 0; }
    // The key of tokens[0..pos) (pos a multiple of block_size).
    uint64_t key(const int32_t* tokens, int32_t pos) const;
    void put(uint64_t key, std::vector<float> state);
    // The longest kept prefix of tokens[0..n): its length and state (0 and null for none).
    std::pair<int32_t, State> longest(const int32_t* tokens, int32_t n);
    size_t size() const { return map_.size(); }

private:
    struct Entry {
        State state;
        std::list<uint64_t>::iterator lru;
    };
    int32_t every_, block_size_;
    size_t max_bytes_, bytes_ = 0;
    std::unordered_map<uint64_t, Entry> map_;
    std::list<uint64_t> lru_;   // most recently used first
};

}  // namespace ember
