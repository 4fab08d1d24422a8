#include "model/host_weights.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ember/status.h"

namespace ember {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kAlign = 4096;   // each tensor starts on a page (and SIMD-load) boundary
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

HostWeights::HostWeights(const std::vector<const GGUFTensor*>& tensors) {
    for (const GGUFTensor* t : tensors)
        if (std::find(sources_.begin(), sources_.end(), t) == sources_.end()) sources_.push_back(t);
    size_t total = 0;
    for (const GGUFTensor* t : sources_) total = align_up(total, kAlign) + t->nbytes;
    if (total == 0) return;
    bytes_ = align_up(total, kHugePage);
    void* p = ::mmap(nullptr, bytes_ + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        throw OutOfMemory(cat("use_mmap=false: cannot allocate ", bytes_ >> 20,
                              " MiB of host memory for the "
                              "CPU blocks' weights (",
                              std::strerror(errno), ")"));
    map_ = p;
    base_ = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(p), kHugePage));
#ifdef MADV_HUGEPAGE
    huge_ = ::madvise(base_, bytes_, MADV_HUGEPAGE) == 0;   // a hint: kernels without THP ignore it
#endif
    size_t off = 0;
    for (const GGUFTensor* t : sources_) {
        off = align_up(off, kAlign);
        std::memcpy(base_ + off, t->data, t->nbytes);
        copies_.push_back(*t);
        copies_.back().data = base_ + off;
        off += t->nbytes;
    }
}

HostWeights::~HostWeights() {
    if (map_) ::munmap(map_, bytes_ + kHugePage);
}

const GGUFTensor* HostWeights::find(const GGUFTensor* t) const {
    const auto it = std::find(sources_.begin(), sources_.end(), t);
    return it == sources_.end() ? t : &copies_[size_t(it - sources_.begin())];
}

}  // namespace ember
