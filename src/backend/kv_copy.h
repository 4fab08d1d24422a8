// Whole KV blocks moved between KV memories (host memory, a GPU staging copy, the GPU cache of the
// KV in host memory) in as few copy calls as the layout allows: the streamed weights
// (streamed_weights.cpp) and the KV in host memory (kv_in_host_memory.cpp) stage blocks this way.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

#include "backend/backend.h"
#include "backend/kv_layout.h"

namespace ember {

// Copies added in order; one that continues the previous on both sides joins it, so a run of
// blocks goes as one call.
template <class Copy>
class CopyRuns {
public:
    explicit CopyRuns(Copy copy) : copy_(std::forward<Copy>(copy)) {}
    void add(uint8_t* dst, const uint8_t* src, size_t bytes) {
        if (bytes_ && dst == dst_ + bytes_ && src == src_ + bytes_) {
            bytes_ += bytes;
            return;
        }
        flush();
        dst_ = dst;
        src_ = src;
        bytes_ = bytes;
    }
    void flush() {
        if (bytes_) copy_(dst_, src_, bytes_);
        bytes_ = 0;
    }

private:
    Copy copy_;
    uint8_t* dst_ = nullptr;
    const uint8_t* src_ = nullptr;
    size_t bytes_ = 0;
};

// copy(dst, src, bytes) for K and for V of blocks ids[0..n) of `from` into the same blocks of
// `to`; a run of consecutive ids goes as one call.
template <class Copy>
void copy_kv_block_runs(const KVLayer& from, const KVLayer& to, const int32_t* ids, size_t n, Copy&& copy) {
    const int64_t width = (int64_t)from.n_head_kv * from.head_dim;
    for (int kv = 0; kv < 2; ++kv) {
        const size_t bb = kv_block_bytes(kv ? from.v_type : from.k_type, from.block_size, width);
        const auto* src = static_cast<const uint8_t*>(kv ? from.v : from.k);
        auto* dst = static_cast<uint8_t*>(kv ? to.v : to.k);
        CopyRuns<Copy&> runs(copy);
        for (size_t b = 0; b < n; ++b) runs.add(dst + (size_t)ids[b] * bb, src + (size_t)ids[b] * bb, bb);
        runs.flush();
    }
}

}  // namespace ember
