// CPU-resident weights (every tensor the CPU reads after load) copied out of the file mapping
// (use_mmap = false, as llama.cpp's --no-mmap) into one anonymous region advised for transparent
// huge pages: decode streams every weight byte per token, and 2 MiB pages spare the page walks of
// 4 KiB page-cache pages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "ember/gguf.h"

namespace ember {

class HostWeights {
public:
    // Copies the bytes of each tensor (duplicates once) and keeps a record of each pointing there.
    explicit HostWeights(const std::vector<const GGUFTensor*>& tensors);
    ~HostWeights();
    HostWeights(const HostWeights&) = delete;
    HostWeights& operator=(const HostWeights&) = delete;

    // The copy of t (t itself when t was not among the tensors copied).
    const GGUFTensor* find(const GGUFTensor* t) const;
    size_t bytes() const { return bytes_; }
    bool huge_pages() const { return huge_; }

private:
    void* map_ = nullptr;       // the anonymous mapping: bytes_ plus one huge page of slack
    uint8_t* base_ = nullptr;   // its first 2 MiB boundary: huge pages need aligned 2 MiB ranges
    size_t bytes_ = 0;
    bool huge_ = false;
    std::vector<const GGUFTensor*> sources_;
    std::deque<GGUFTensor> copies_;   // copies_[i] is the copy of sources_[i]
};

}  // namespace ember
