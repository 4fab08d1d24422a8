// Host-side re-layout of ggml weight blocks for upload (see weight_pack.h for the layout).
#include "weight_pack.h"

#include <cstring>

#include "ember/status.h"
#include "kernel_choice.h"

namespace ember {
namespace cuda {

namespace {
size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

// L for a format split at upload: qs, meta and meta2 bytes per block, the regions of nblk blocks
// each one after the other from a 256-byte boundary.
PackedLayout split_layout(PackedLayout L, size_t nblk, int qs, int meta, int meta2 = 0) {
    L.qs_bytes = qs;
    L.meta_bytes = meta;
    L.meta2_bytes = meta2;
    L.meta_off = align256(nblk * L.qs_bytes);
    L.meta2_off = align256(L.meta_off + nblk * L.meta_bytes);
    L.total = L.meta2_off + nblk * L.meta2_bytes;
    return L;
}
}  // namespace

const TypeTraits& block_info(GGMLType type) {
    if (!cuda_weight_type(type)) fail("cuda: weight type ", uint32_t(type), " is not supported by the CUDA backend");
    return type_traits(type);
}

PackedLayout packed_layout(GGMLType type, int64_t n_in, int64_t n_out) {
    const TypeTraits& tt = block_info(type);
    if (n_in % tt.block_elems != 0)
        fail("cuda: a ", tt.name, " row of ", n_in, " elements is not a whole number of ", tt.block_elems,
             "-element blocks");
    PackedLayout L;
    L.n_blocks = n_in / tt.block_elems;
    const size_t nblk = size_t(L.n_blocks) * size_t(n_out);
    switch (type) {
        case GGMLType::F32:
        case GGMLType::F16:
        case GGMLType::BF16:
        case GGMLType::Q4_K:
        case GGMLType::Q5_K:
            L.total = nblk * tt.block_bytes;
            if (type == GGMLType::F32 && n_in % 4)
                fail("cuda: F32 rows must hold a multiple of 4 elements, got ", n_in);
            if ((type == GGMLType::F16 || type == GGMLType::BF16) && n_in % 8)
                fail("cuda: F16/BF16 rows must hold a multiple of 8 elements, got ", n_in);
            return L;
        case GGMLType::Q4_0: return split_layout(L, nblk, 16, 2);
        case GGMLType::Q4_1: return split_layout(L, nblk, 16, 4);
        case GGMLType::Q5_0: return split_layout(L, nblk, 16, 8);
        case GGMLType::Q5_1: return split_layout(L, nblk, 16, 8);
        case GGMLType::Q8_0: return split_layout(L, nblk, 32, 2);
        case GGMLType::Q6_K: return split_layout(L, nblk, 192, 16, 2);
        case GGMLType::Q2_K: return split_layout(L, nblk, 80, 4);
        case GGMLType::Q3_K: return split_layout(L, nblk, 112, 2);
        case GGMLType::MXFP4: return split_layout(L, nblk, 16, 2);
        case GGMLType::IQ4_NL: return split_layout(L, nblk, 16, 2);
        case GGMLType::IQ4_XS: return split_layout(L, nblk, 128, 8);
        case GGMLType::IQ3_S: return split_layout(L, nblk, 112, 2);
        case GGMLType::IQ3_XXS: return split_layout(L, nblk, 96, 2);
        case GGMLType::IQ2_XXS: return split_layout(L, nblk, 64, 2);
        case GGMLType::IQ2_XS: return split_layout(L, nblk, 80, 2);
        case GGMLType::IQ2_S: return split_layout(L, nblk, 80, 2);
        case GGMLType::IQ1_S: return split_layout(L, nblk, 48, 2);
        case GGMLType::IQ1_M: return split_layout(L, nblk, 64, 0);
        case GGMLType::TQ1_0: return split_layout(L, nblk, 64, 2);
        case GGMLType::TQ2_0: return split_layout(L, nblk, 64, 2);
        case GGMLType::NVFP4: return split_layout(L, nblk, 32, 4);
        default: fail("cuda: weight type ", tt.name, " has no packed layout");
    }
}

void pack_weight(GGMLType type, int64_t n_in, int64_t n_out, const uint8_t* src, uint8_t* dst) {
    const PackedLayout L = packed_layout(type, n_in, n_out);
    const TypeTraits& tt = block_info(type);
    const size_t nblk = size_t(L.n_blocks) * size_t(n_out);
    if (L.qs_bytes == 0) {
        std::memcpy(dst, src, nblk * tt.block_bytes);
        return;
    }
    uint8_t* qs = dst;
    uint8_t* meta = dst + L.meta_off;
    uint8_t* meta2 = dst + L.meta2_off;
    std::memset(dst, 0, L.total);
    for (size_t b = 0; b < nblk; ++b) {
        const uint8_t* s = src + b * tt.block_bytes;
        uint8_t* q = qs + b * L.qs_bytes;
        uint8_t* m = meta + b * L.meta_bytes;
        switch (type) {
            case GGMLType::Q4_0:   // {f16 d; u8 qs[16]}
            case GGMLType::IQ4_NL:
                std::memcpy(m, s, 2);
                std::memcpy(q, s + 2, 16);
                break;
            case GGMLType::IQ3_XXS:   // {f16 d; u8 qs[96]}
            case GGMLType::IQ2_XXS:   // {f16 d; u8 qs[64]}
            case GGMLType::IQ2_XS:    // {f16 d; u16 qs[32]; u8 scales[8]} (80: 8 bytes of pad)
            case GGMLType::IQ2_S:     // {f16 d; u8 qs[32], signs[32], qh[8], scales[8]}
            case GGMLType::IQ1_S:     // {f16 d; u8 qs[32]; u16 qh[8]}
            case GGMLType::NVFP4:     // {u8 d[4]; u8 qs[32]}: L.meta_bytes 4
                std::memcpy(m, s, size_t(L.meta_bytes));
                std::memcpy(q, s + L.meta_bytes, size_t(tt.block_bytes - L.meta_bytes));
                break;
            case GGMLType::TQ1_0:   // {u8 qs[48], qh[4]; f16 d} (64: 12 bytes of pad)
            case GGMLType::TQ2_0:   // {u8 qs[64]; f16 d}
            case GGMLType::IQ1_M:   // {u8 qs[32], qh[16], scales[8]} (64: 8 bytes of pad; no meta)
            case GGMLType::Q2_K:    // {u8 scales[16], qs[64]; f16 d, dmin}
            case GGMLType::Q3_K:    // {u8 hmask[32], qs[64], scales[12]; f16 d} (112: 4 bytes of pad)
                std::memcpy(q, s, size_t(tt.block_bytes - L.meta_bytes));
                std::memcpy(m, s + tt.block_bytes - L.meta_bytes, size_t(L.meta_bytes));
                break;
            case GGMLType::Q4_1:   // {f16 d, m; u8 qs[16]}
                std::memcpy(m, s, 4);
                std::memcpy(q, s + 4, 16);
                break;
            case GGMLType::Q5_0: { // {f16 d; u8 qh[4]; u8 qs[16]}
                MetaQ5_0 mm{};
                std::memcpy(&mm.d, s, 2);
                std::memcpy(&mm.qh, s + 2, 4);
                std::memcpy(m, &mm, sizeof mm);
                std::memcpy(q, s + 6, 16);
                break;
            }
            case GGMLType::Q5_1: { // {f16 d, m; u8 qh[4]; u8 qs[16]}
                MetaQ5_1 mm{};
                std::memcpy(&mm.d, s, 2);
                std::memcpy(&mm.m, s + 2, 2);
                std::memcpy(&mm.qh, s + 4, 4);
                std::memcpy(m, &mm, sizeof mm);
                std::memcpy(q, s + 8, 16);
                break;
            }
            case GGMLType::Q8_0:   // {f16 d; i8 qs[32]}
                std::memcpy(m, s, 2);
                std::memcpy(q, s + 2, 32);
                break;
            case GGMLType::MXFP4:   // {u8 e; u8 qs[16]} -> meta {e, 0}
                m[0] = s[0];
                std::memcpy(q, s + 1, 16);
                break;
            case GGMLType::IQ4_XS:   // {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}
                std::memcpy(m, s, 8);
                std::memcpy(q, s + 8, 128);
                break;
            case GGMLType::IQ3_S:   // {f16 d; u8 qs[64], qh[8], signs[32], scales[4]}
                std::memcpy(m, s, 2);
                std::memcpy(q, s + 2, 64);
                std::memcpy(q + 64, s + 74, 32);
                std::memcpy(q + 96, s + 66, 8);
                std::memcpy(q + 104, s + 106, 4);
                break;
            case GGMLType::Q6_K:   // {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
                std::memcpy(q, s, 192);
                std::memcpy(m, s + 192, 16);
                std::memcpy(meta2 + b * 2, s + 208, 2);
                break;
            default: break;
        }
    }
}

}  // namespace cuda
}  // namespace ember
