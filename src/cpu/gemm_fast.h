// Fast quantized matmul: weight rows sit in the vector lanes, so one int8 dot instruction serves a
// vector of rows of one token (16 with AVX-512) and the per-block scale is one vector FMA over
// them. Its float sums are not vec_dot's (results agree to float rounding, not bit for bit): types
// with a single-token form (FastGemm::gemv) take it for every batch, the others only for batches
// of several sequences (cpu_matmul.cpp).
//
// Activations are quantized as vec_dot quantizes them for the weight type (Q8_0, Q8_1, Q8_K: the
// same int8 values, scales and Q8_1 sums), so the results differ from the exact path's only by
// float rounding, and are laid out in tiles of kFastTok tokens, block of 32 by block
// (FastActBlock), so the kernel reads a block of every token of its tile from one place.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cpu/cpu_kernels.h"
#include "ember/quant.h"

namespace ember {

constexpr int kFastTok = 8;   // tokens per activation tile

// One 32-element block of the kFastTok tokens of a tile: the int8 values, their scale (Q8_K: the
// super-block's), and the sum terms that weight offsets and mins fold in: s = d * sum(q) (Q8_1:
// its fp16 s), for the mins of Q4_1, Q4_K, Q5_K; n = -offset * sum(q) and h = -offset *
// sum(q[0..15]), for weights stored with an offset (Q4_0 8, Q8_0 taken as unsigned 128, Q6_K 32,
// whose scales change after 16 elements).
struct FastActBlock {
    int8_t q[kFastTok][32];
    float d[kFastTok];
    float s[kFastTok];
    int32_t n[kFastTok];
    int32_t h[kFastTok];
};
static_assert(sizeof(FastActBlock) == 384, "FastActBlock layout");

struct FastGemm {
    // y[t * n_out + o] = dot(row o of w, token t) for o in [o_begin, o_end) and every t < n_tok,
    // act prepared by fast_gemm_prepare for this FastGemm.
    void (*gemm)(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* act, int32_t n_tok, int64_t o_begin,
                 int64_t o_end, float* y, int64_t n_out);
    // One token: y[o] for o in [o_begin, o_end), act prepared by fast_gemv_prepare. Each output is
    // the same float as gemm's for that token in any batch (the same integer block sums, the same
    // float operations in the same order), while each weight row is read as one run of bytes
    // (nullptr where there is no such kernel: one token then goes through vec_dot).
    void (*gemv)(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* act, int64_t o_begin, int64_t o_end,
                 float* y);
    int64_t row_tile;    // rows per kernel step: callers hand out whole multiples of it
    GGMLType act_type;   // the activation quantizer (vec_dot's: Q8_0, Q8_1 or Q8_K)
    int32_t offset;      // the weight offset of FastActBlock::n and h (0: none)
};

// The fast kernel of `type` at a SIMD level (the backend's, EMBER_SIMD included), or nullptr
// where there is none (the caller keeps the exact tiles).
const FastGemm* fast_gemm_for(GGMLType type, SimdLevel level);
const FastGemm* fast_gemm_avx512_for(GGMLType type);
const FastGemm* fast_gemm_avx2_for(GGMLType type);

// Bytes of the prepared activations of n_tok tokens of n_in elements (n_in a multiple of 32).
size_t fast_gemm_act_bytes(int64_t n_in, int32_t n_tok);
// Quantizes blocks [b_begin, b_end) of tokens [t_begin, t_end) of x (rows of n_in floats) into act
// for kernel k. Each block is quantized on its own (Q8_K: each run of 8), so threads may take
// token ranges (whole tiles keep them off each other's cache lines) or block ranges (whole Q8_K
// super-blocks: a block's FastActBlock holds all the tokens of its tile).
void fast_gemm_prepare(const FastGemm& k, const float* x, int64_t n_in, int32_t t_begin, int32_t t_end, int64_t b_begin,
                       int64_t b_end, uint8_t* act, SimdLevel level);

// One token's activations for FastGemm::gemv: the int8 values of its nb = n_in / 32 blocks one
// after the other (64 bytes of zeros after them, so a kernel may read a whole block pair past an
// odd last block), then per block its d, s (floats) and n (int32), the values FastActBlock holds
// for a token.
struct FastActOne {
    const int8_t* q;
    const float* d;
    const float* s;
    const int32_t* n;
};
size_t fast_gemv_act_bytes(int64_t n_in);
FastActOne fast_gemv_act(const uint8_t* act, int64_t n_in);
void fast_gemv_prepare(const FastGemm& k, const float* x, int64_t n_in, uint8_t* act, SimdLevel level);

}  // namespace ember
