// A CPU matmul split into its kernel choice and its rows: CpuBackend::matmul runs one on the pool,
// the grouped moe (cpu_moe_grouped.cpp) hands out the rows of many at once.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "cpu/gemm.h"
#include "cpu/gemm_fast.h"

namespace ember {

// The kernels a matmul can take (cpu_matmul.cpp says which batch takes which).
enum class MatmulPath { fast_gemv, fast_gemm, tiled, dots };

// One matmul y = x w^T with its kernel chosen and x prepared for it: rows(b, e) computes outputs
// [b, e) of every token, each row one kernel call, so any split of the rows gives the same bits.
struct MatmulRows {
    MatmulPath path = MatmulPath::dots;
    const Weight* w = nullptr;
    const FastGemm* fast = nullptr;   // fast_gemv, fast_gemm
    GemmFn gemm = nullptr;            // tiled
    VecDotFn dot = nullptr;           // tiled, dots
    GGMLType act_type = GGMLType::F32;   // tiled, dots: the format x is quantized to
    const uint8_t* act = nullptr;     // x prepared for the kernel
    size_t x_row = 0;                 // tiled, dots: bytes of one token's prepared row
    int32_t n_tok = 0;
    float* y = nullptr;
    int64_t tile() const { return fast ? fast->row_tile : path == MatmulPath::tiled ? 16 : 1; }
    void rows(int64_t b, int64_t e) const;
};

}  // namespace ember
