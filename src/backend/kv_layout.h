// Byte layout of a paged KV cache block for each KV element type, shared by every backend (the
// streamed partial offload copies whole blocks between host and GPU as raw bytes).
//
// A block holds block_size token rows of `width` = n_head_kv * head_dim elements, K and V in
// separate buffers. F16 / BF16 / F32: [block_size][width] elements. Q8_0 (llama.cpp's -ctk/-ctv q8_0;
// halves the bytes decode attention reads at long contexts) is head-major, so one head's keys
// of a block are one contiguous run for the decode kernel: all int8 values first,
// [n_head_kv][block_size][head_dim], then one f16 scale per 32 values,
// [n_head_kv][block_size][head_dim / 32] (kv_q8_value / kv_q8_scale give the offsets). A value
// is scale * int8 with scale = amax / 127 of its 32-value group and int8 = round(x / scale), as
// ggml's quantize_row_q8_0. Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL: [block_size] rows of width
// values, each row ggml's blocks of 32 (a head's slice is head_dim / 32 whole blocks).
#pragma once
#include <cstddef>
#include <cstdint>

#include "ember/quant.h"
#include "ember/status.h"

namespace ember {

// Q8_0: offsets in a block of head `head`, slot `slot`: of its first int8 value (bytes) and of
// its first f16 scale (in scales, after the block's block_size * width int8 values).
inline size_t kv_q8_value(int32_t block_size, int32_t head_dim, int32_t head, int32_t slot) {
    return (size_t(head) * block_size + slot) * head_dim;
}
inline size_t kv_q8_scale(int32_t block_size, int32_t head_dim, int32_t head, int32_t slot) {
    return (size_t(head) * block_size + slot) * (head_dim / 32);
}

// Bytes of one block of one of K or V.
inline size_t kv_block_bytes(GGMLType t, int32_t block_size, int64_t width) {
    const size_t n = size_t(block_size) * size_t(width);
    switch (t) {
        case GGMLType::F32: return n * 4;
        case GGMLType::Q8_0: return n + n / 32 * 2;
        case GGMLType::Q4_0:
        case GGMLType::Q4_1:
        case GGMLType::Q5_0:
        case GGMLType::Q5_1:
        case GGMLType::IQ4_NL: return row_bytes(t, int64_t(n));
        default: return n * 2;
    }
}

// The KV types stored in blocks of 32 values.
inline bool kv_type_is_blocked(GGMLType t) {
    return t == GGMLType::Q8_0 || t == GGMLType::Q4_0 || t == GGMLType::Q4_1 || t == GGMLType::Q5_0 ||
           t == GGMLType::Q5_1 || t == GGMLType::IQ4_NL;
}

// Throws InvalidInput unless `t` is a KV type for heads of head_dim: a block of 32 values must
// not straddle two heads, since attention reads one head's slice of a row. `which` names the
// cache in the message (type_k, type_v).
inline void check_kv_type(GGMLType t, int32_t head_dim, const char* which) {
    const TypeTraits* tr = find_type_traits(uint32_t(t));
    if (t != GGMLType::F16 && t != GGMLType::BF16 && t != GGMLType::F32 && !kv_type_is_blocked(t))
        fail(which, ": KV cache type ", tr ? tr->name : "?", " (ggml type ", uint32_t(t),
             ") is not supported; use F16, BF16, F32, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or IQ4_NL");
    if (kv_type_is_blocked(t) && head_dim % 32 != 0)
        fail(which, ": a ", tr->name, " KV cache needs head_dim to be a multiple of 32, got head_dim ", head_dim,
             " (use the F16 cache)");
}

}  // namespace ember
