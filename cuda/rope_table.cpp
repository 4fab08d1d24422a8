// RopeTables: host-computed rope rotations uploaded per RopeParams (see rope_table.h).
#include "rope_table.h"

#include <algorithm>

#include "cuda_check.h"
#include "ember/status.h"

namespace ember {
namespace cuda {

namespace {
int32_t capacity_for(int32_t n_pos) {
    int32_t c = 4096;
    while (c < n_pos) c *= 2;
    return c;
}
}  // namespace

RopeTables::~RopeTables() {
    for (Table& t : tables_) cudaFree(t.dev);
}

void RopeTables::fill(Table& t, int32_t n_pos, cudaStream_t s) {
    const int32_t half = t.params.rotated() / 2, cap = capacity_for(n_pos);
    std::vector<float2> host(size_t(cap) * half);
    for (int32_t p = 0; p < cap; ++p)
        for (int32_t i = 0; i < half; ++i) {
            float2& cs = host[size_t(p) * half + i];
            rope_cos_sin(p, i, t.params, cs.x, cs.y);
        }
    EMBER_CUDA_CHECK(cudaStreamSynchronize(s));   // no queued kernel still reads the old table
    if (t.dev) EMBER_CUDA_CHECK(cudaFree(t.dev));
    t.dev = nullptr;
    EMBER_CUDA_CHECK(cudaMalloc(&t.dev, host.size() * sizeof(float2)));
    copy_to_device_now(t.dev, host.data(), host.size() * sizeof(float2), s);
    t.capacity = cap;
}

const float2* RopeTables::get(const RopeParams& params, int32_t n_pos, cudaStream_t s, bool& moved) {
    if (params.head_dim <= 0 || params.head_dim % 2)
        fail("cuda rope: head_dim ", params.head_dim, " must be positive and even");
    if (params.rotated() <= 0 || params.rotated() % 2 || params.rotated() > params.head_dim)
        fail("cuda rope: ", params.rotated(), " rotated dimensions of a head of ", params.head_dim,
             " (must be even, at most the head)");
    if (!params.freq_factors.empty() && int64_t(params.freq_factors.size()) != params.rotated() / 2)
        fail("cuda rope: ", params.freq_factors.size(), " frequency factors for ", params.rotated() / 2,
             " rotated pairs");
    auto it = std::find_if(tables_.begin(), tables_.end(), [&](const Table& t) { return t.params == params; });
    if (it == tables_.end()) {
        tables_.push_back(Table{params, 0, nullptr});
        it = tables_.end() - 1;
    }
    if (it->capacity < n_pos) {
        fill(*it, n_pos, s);
        moved = true;
    }
    return it->dev;
}

bool RopeTables::reserve(int32_t n_pos, cudaStream_t s) {
    bool moved = false;
    for (Table& t : tables_)
        if (t.capacity < n_pos) {
            fill(t, n_pos, s);
            moved = true;
        }
    return moved;
}

}  // namespace cuda
}  // namespace ember
