// HostTierMemory: the host tier's slot arrays, pinned where the backend can pin them.
#include "model/host_tier_memory.h"

#include <cstdio>
#include <map>
#include <new>

#include "ember/status.h"

namespace ember {

HostTierMemory::~HostTierMemory() {
    for (const Chunk& c : chunks_) c.pinned ? c.be->free_host(c.p) : ::operator delete(c.p);
}

void HostTierMemory::allocate(const std::vector<Backend*>& be, const std::vector<std::pair<size_t, size_t>>& kv_bytes,
                              int32_t n_slots) {
    n_slots_ = n_slots;
    std::map<Backend*, size_t> total;
    for (size_t l = 0; l < be.size(); ++l) total[be[l]] += (kv_bytes[l].first + kv_bytes[l].second) * n_slots;
    std::map<Backend*, uint8_t*> next;
    bool warned = false;
    for (auto [b, bytes] : total) {
        Chunk c{b, nullptr, true};
        try {
            c.p = b->alloc_host(bytes);
        } catch (const std::exception&) {
            c.p = nullptr;
        }
        if (!c.p) {
            c.pinned = false;
            try {
                c.p = ::operator new(bytes);
            } catch (const std::bad_alloc&) {
                throw OutOfMemory(cat("the host tier needs ", bytes / (1024.0 * 1024.0), " MiB of host memory (",
                                      n_slots, " blocks) that could not be allocated: lower kv_host_mb"));
            }
            if (!warned)
                std::fprintf(stderr,
                             "ember: warning: the host tier (%.1f MiB) could not be pinned on %s; it uses "
                             "plain memory, whose copies are slower\n",
                             bytes / (1024.0 * 1024.0), b->name());
            warned = true;
        }
        chunks_.push_back(c);
        next[b] = static_cast<uint8_t*>(c.p);
    }
    for (size_t l = 0; l < be.size(); ++l) {
        uint8_t*& p = next[be[l]];
        k_.push_back(p);
        p += kv_bytes[l].first * n_slots;
        v_.push_back(p);
        p += kv_bytes[l].second * n_slots;
    }
}

}  // namespace ember
