// The host tier's slot states (free / owned / cached), its LRU of cached slots, and the pins that
// keep a slot whose bytes a pending copy still reads from being handed out in the same step.
#include "kv/host_tier.h"

#include "ember/status.h"

namespace ember {

HostTier::HostTier(int32_t n_slots) {
    if (n_slots < 0) fail("HostTier: n_slots must be >= 0, got ", n_slots);
    state_.assign(n_slots, State::free);
    pinned_.assign(n_slots, 0);
    key_.assign(n_slots, 0);
    lru_ = LruList(n_slots);
    // Slots are handed out 0, 1, 2...: a swap's slots are then mostly consecutive, and consecutive
    // slots copy as one range.
    free_ = free_stack(n_slots);
}

void HostTier::check_slot(int32_t slot, const char* fn) const {
    if (slot < 0 || slot >= n_slots()) fail("HostTier.", fn, ": slot ", slot, " out of range [0, ", n_slots(), ")");
}

void HostTier::drop(int32_t slot) {
    by_key_.erase(key_[slot]);
    lru_.remove(slot);
    state_[slot] = State::free;
}

int32_t HostTier::coldest_unpinned() const {
    for (int32_t s : lru_)
        if (!pinned_[s]) return s;
    return -1;
}

void HostTier::to_free(int32_t slot) {
    state_[slot] = State::free;
    (pinned_[slot] ? released_ : free_).push_back(slot);
}

int32_t HostTier::n_available() const { return (int32_t)(free_.size() + lru_.size()) - n_pinned_cached_; }

std::vector<int32_t> HostTier::take(int32_t n) {
    if (n < 0) fail("HostTier.take: n must be >= 0, got ", n);
    std::vector<int32_t> slots;
    if (n > n_available()) return slots;
    slots.reserve(n);
    while ((int32_t)slots.size() < n) {
        int32_t s;
        if (!free_.empty()) {
            s = free_.back();
            free_.pop_back();
        } else {
            s = coldest_unpinned();
            drop(s);
        }
        state_[s] = State::owned;
        slots.push_back(s);
    }
    n_owned_ += n;
    return slots;
}

void HostTier::give_back(int32_t slot) {
    check_slot(slot, "give_back");
    if (state_[slot] != State::owned) fail("HostTier.give_back: slot ", slot, " is not owned");
    --n_owned_;
    to_free(slot);
}

int32_t HostTier::store(uint64_t key) {
    if (auto it = by_key_.find(key); it != by_key_.end()) {
        lru_.renew(it->second);
        return -1;
    }
    int32_t s;
    if (!free_.empty()) {
        s = free_.back();
        free_.pop_back();
    } else if ((s = coldest_unpinned()) >= 0) {
        drop(s);
    } else {
        return -1;
    }
    state_[s] = State::cached;
    key_[s] = key;
    by_key_.emplace(key, s);
    lru_.push_newest(s);
    ++stores_;
    return s;
}

int32_t HostTier::lookup(uint64_t key) {
    ++lookups_;
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return -1;
    ++hits_;
    const int32_t s = it->second;
    lru_.renew(s);
    pin(s);
    return s;
}

void HostTier::pin(int32_t slot) {
    check_slot(slot, "pin");
    if (state_[slot] == State::free) fail("HostTier.pin: slot ", slot, " is free");
    if (pinned_[slot]) return;
    pinned_[slot] = 1;
    pinned_list_.push_back(slot);
    if (state_[slot] == State::cached) ++n_pinned_cached_;
}

void HostTier::end_step() {
    for (int32_t s : pinned_list_) pinned_[s] = 0;
    pinned_list_.clear();
    n_pinned_cached_ = 0;
    free_.insert(free_.end(), released_.begin(), released_.end());
    released_.clear();
}

void HostTier::clear_cache() {
    while (!lru_.empty()) {
        const int32_t s = lru_.oldest();
        drop(s);
        to_free(s);
    }
    n_pinned_cached_ = 0;
}

HostTierStats HostTier::stats() const {
    HostTierStats st;
    st.n_slots = n_slots();
    st.n_used = n_owned_;
    st.n_cached = (int32_t)lru_.size();
    st.n_free = st.n_slots - st.n_used - st.n_cached;
    st.lookups = lookups_;
    st.hits = hits_;
    st.stores = stores_;
    return st;
}

}  // namespace ember
