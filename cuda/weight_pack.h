// Device layout of uploaded weights. Block formats whose size is not a multiple of 16 bytes
// (Q4_0 18 B, Q4_1 20, Q5_0 22, Q5_1 24, Q8_0 34, Q2_K 84, Q3_K 110, Q6_K 210, MXFP4 17, IQ4_NL 18, IQ4_XS 136, IQ3_S
// 110, IQ3_XXS 98, IQ2_XXS 66, IQ2_XS 74, IQ2_S 82, IQ1_S 50, IQ1_M 56, TQ1_0 54, TQ2_0 66, NVFP4 36) are split
// at upload into a quants region (16-byte aligned, one 16/32/48/64/80/96/112/128/192-byte group per block) and
// metadata regions, so the GEMV streams quants with 16-byte loads. Q4_K (144 B) and
// Q5_K (176 B) and floats stay as is.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ember/quant.h"

namespace ember {
namespace cuda {

struct PackedLayout {
    int64_t n_blocks = 0; // blocks per row
    int qs_bytes = 0; // quant bytes per block in the qs region (0: raw layout)
    int meta_bytes = 0; // bytes per block in the meta region
    int meta2_bytes = 0; // bytes per block in the meta2 region (Q6_K: d)
    size_t meta_off = 0, meta2_off = 0, total = 0; // byte offsets from the weight's base
};

// Per-block metadata of the small formats (the quants live in the qs region).
struct MetaQ5_0 {
    uint16_t d;
    uint16_t pad;
    uint32_t qh;
};
struct MetaQ5_1 {
    uint16_t d, m;
    uint32_t qh;
};

// The block format (include/ember/quant.h) of a type the CUDA backend runs; throws InvalidInput
// for the others.
const TypeTraits& block_info(GGMLType type);

PackedLayout packed_layout(GGMLType type, int64_t n_in, int64_t n_out);
// Rewrites ggml blocks (n_out rows of n_in elements) into `dst` (layout.total bytes).
void pack_weight(GGMLType type, int64_t n_in, int64_t n_out, const uint8_t* src, uint8_t* dst);

} // namespace cuda
} // namespace ember
