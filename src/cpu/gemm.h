// Tiled quantized matmul kernels for batches (n_tok > 1): each decodes a weight block once for
// several tokens, and reproduces the runtime vec_dot kernel it stands in for bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cpu/cpu_kernels.h"

namespace ember {

// y[t * n_out + o] = dot(n_in, w + o * w_row, x + t * x_row) for o in [o_begin, o_end) and
// every t < n_tok, where x holds the activations already quantized to the vec_dot type.
using GemmFn = void (*)(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok,
                        int64_t o_begin, int64_t o_end, float* y, int64_t n_out);

// The tiled kernel whose every output equals what `dot` returns, or nullptr when there is
// none for that kernel (the caller then loops over dot). Matching on the function pointer
// keeps the choice tied to the vec_dot the kernel table picked (EMBER_SIMD included).
GemmFn gemm_avx512_for(VecDotFn dot);
GemmFn gemm_avx2_for(VecDotFn dot);
// Q2_K's and Q3_K's tiles (vec_dot_q2_q3_avx*.cpp, beside their dots), rows of the tables above.
GemmFn gemm_q2_q3_avx512(GGMLType type);
GemmFn gemm_q2_q3_avx2(GGMLType type);

// One row per tiled type of an ISA: adding a type to a tile file is one row of its table.
struct GemmEntry {
    GGMLType type;
    GemmFn gemm;
};
template <size_t N>
GemmFn gemm_lookup(VecDotFn dot, VecDotFn (*isa_vec_dot)(GGMLType), const GemmEntry (&table)[N]) {
    if (!dot) return nullptr;
    for (const GemmEntry& e : table)
        if (dot == isa_vec_dot(e.type)) return e.gemm;
    return nullptr;
}
// F32, F16 and BF16 weights' tiles (gemm_float_avx*.cpp), apart from the quantized types' tables.
GemmFn gemm_float_avx512_for(VecDotFn dot);
GemmFn gemm_float_avx2_for(VecDotFn dot);
inline GemmFn gemm_for(VecDotFn dot) {
    for (GemmFn (*lookup)(VecDotFn) : {gemm_avx512_for, gemm_avx2_for, gemm_float_avx512_for, gemm_float_avx2_for})
        if (const GemmFn f = lookup(dot)) return f;
    return nullptr;
}

// The loop every tiled kernel shares: token tiles of C outside (their activations stay in L1
// while the chunk's rows pass), row tiles of R inside; rows and tokens left over go through dot,
// which the tiles reproduce bit for bit. prepare(xt) runs once per token tile; tile(wr, xt, yt)
// writes yt[c * n_out + r] for rows wr[0..R) and tokens xt[0..C).
template <int R, int C, class Prepare, class Tile>
void run_tiles(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* x, size_t x_row, int32_t n_tok,
               int64_t o_begin, int64_t o_end, float* y, int64_t n_out, VecDotFn dot, Prepare&& prepare, Tile&& tile) {
    const int64_t o_tiled = o_begin + (o_end - o_begin) / R * R;
    int32_t t = 0;
    for (; t + C <= n_tok; t += C) {
        const uint8_t* xt[C];
        for (int c = 0; c < C; ++c) xt[c] = x + (t + c) * x_row;
        prepare(xt);
        for (int64_t o = o_begin; o < o_tiled; o += R) {
            const uint8_t* wr[R];
            for (int r = 0; r < R; ++r) wr[r] = w + (o + r) * w_row;
            tile(wr, xt, y + int64_t(t) * n_out + o);
        }
        for (int64_t o = o_tiled; o < o_end; ++o)
            for (int c = 0; c < C; ++c) y[int64_t(t + c) * n_out + o] = dot(n_in, w + o * w_row, xt[c]);
    }
    for (; t < n_tok; ++t)
        for (int64_t o = o_begin; o < o_end; ++o) y[int64_t(t) * n_out + o] = dot(n_in, w + o * w_row, x + t * x_row);
}

}  // namespace ember
