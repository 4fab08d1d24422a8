// Whole KV blocks moved between two KV layers of one geometry (host memory and a GPU staging
// copy): the streamed partial offload stages blocks this way.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "backend/kv_layout.h"

namespace ember {

// copy(dst, src, bytes) for K and for V of blocks ids[0..n) of `from` into the same blocks of
// `to`; a run of consecutive ids goes as one call.
template <class Copy>
void copy_kv_block_runs(const KVLayer& from, const KVLayer& to, const int32_t* ids, size_t n, Copy&& copy) {
    const int64_t width = (int64_t)from.n_head_kv * from.head_dim;
    for (size_t b = 0; b < n;) {
        size_t e = b + 1;
        while (e < n && ids[e] == ids[e - 1] + 1) ++e;
        for (int kv = 0; kv < 2; ++kv) {
            const size_t block_bytes = kv_block_bytes(kv ? from.v_type : from.k_type, from.block_size, width);
            const size_t off = (size_t)ids[b] * block_bytes;
            copy(static_cast<uint8_t*>(kv ? to.v : to.k) + off, static_cast<const uint8_t*>(kv ? from.v : from.k) + off,
                 (e - b) * block_bytes);
        }
        b = e;
    }
}

}  // namespace ember
