// The orders the KV bookkeeping keeps its ids in (BlockPool's blocks, HostTier's slots): a stack of
// free ids and a least-recently-used list of cached ones.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <vector>

namespace ember {

// Ids n - 1 down to 0: a stack popped from the back hands out 0, 1, 2... first.
inline std::vector<int32_t> free_stack(int32_t n) {
    std::vector<int32_t> ids;
    ids.reserve(size_t(n));
    for (int32_t id = n - 1; id >= 0; --id) ids.push_back(id);
    return ids;
}

// Ids 0..n-1, each at most once, oldest first; adding, removing or renewing any one is O(1), since
// each id keeps its place in the list.
class LruList {
public:
    explicit LruList(int32_t n = 0) : pos_(size_t(n)) {}

    void push_newest(int32_t id) { pos_[id] = order_.insert(order_.end(), id); }
    void renew(int32_t id) { order_.splice(order_.end(), order_, pos_[id]); }
    void remove(int32_t id) {
        order_.erase(pos_[id]);
        pos_[id] = {};
    }
    void clear() {
        for (int32_t id : order_) pos_[id] = {};
        order_.clear();
    }

    int32_t oldest() const { return order_.front(); }
    bool empty() const { return order_.empty(); }
    size_t size() const { return order_.size(); }
    std::list<int32_t>::const_iterator begin() const { return order_.begin(); }
    std::list<int32_t>::const_iterator end() const { return order_.end(); }

private:
    std::list<int32_t> order_;
    std::vector<std::list<int32_t>::iterator> pos_;   // valid where listed
};

}  // namespace ember
