// Device tables of rope rotations, one per RopeParams (base, head_dim, mode, linear / YaRN
// scaling, frequency factors, rotated dimensions): (cos, sin) of every rotated pair i at every
// position p below the capacity, at [p * rotated / 2 + i], from rope_cos_sin of backend/rope_angles.h, the values the CPU
// backend rotates with. The GPU then rounds rope as the CPU does, and no kernel computes sin or
// cos. Tables grow (to powers of two, at least 4096 positions) ahead of the positions a batch
// reaches; growing moves them, so recorded graphs must be dropped.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/rope_angles.h"

namespace ember {
namespace cuda {

class RopeTables {
public:
    RopeTables() = default;
    RopeTables(const RopeTables&) = delete;
    RopeTables& operator=(const RopeTables&) = delete;
    ~RopeTables();

    // The table of `params` covering positions [0, n_pos), built on first use; `moved` is set
    // when a table was (re)allocated.
    const float2* get(const RopeParams& params, int32_t n_pos, cudaStream_t s, bool& moved);
    // Grows every table to cover [0, n_pos); true when one moved.
    bool reserve(int32_t n_pos, cudaStream_t s);

private:
    struct Table {
        RopeParams params;
        int32_t capacity;
        float2* dev;
    };
    void fill(Table& t, int32_t n_pos, cudaStream_t s);
    std::vector<Table> tables_;
};

} // namespace cuda
} // namespace ember
