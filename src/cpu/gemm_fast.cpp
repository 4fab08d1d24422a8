// The fast batched matmul's ISA choice and its activation layout (gemm_fast.h): activations
// quantized by this CPU's quantizer for vec_dot's type, then scattered into tiles of kFastTok
// tokens with each block's float scale and the sum terms the weight type folds in.
#include "cpu/gemm_fast.h"

#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "ember/quant.h"

namespace ember {

const FastGemm* fast_gemm_for(GGMLType type, SimdLevel level) {
    const FastGemm* k = level == SimdLevel::avx512 ? fast_gemm_avx512_for(type) : nullptr;
    if (!k && int(level) >= int(SimdLevel::avx2)) k = fast_gemm_avx2_for(type);
    return k;
}

size_t fast_gemm_act_bytes(int64_t n_in, int32_t n_tok) {
    const int64_t tiles = (n_tok + kFastTok - 1) / kFastTok;
    return size_t(tiles * (n_in / 32)) * sizeof(FastActBlock);
}

namespace {

// Block b's values, scale and fp16 sum (Q8_1; nullptr otherwise) in a row quantized to `type`.
struct SrcBlock {
    const int8_t* q;
    float d;
    const uint16_t* s;
};
SrcBlock src_block(GGMLType type, const uint8_t* row, int64_t b) {
    switch (type) {
        case GGMLType::Q8_1: {
            const auto& x = reinterpret_cast<const BlockQ8_1*>(row)[b];
            return {x.qs, half_to_float(x.d), &x.s};
        }
        case GGMLType::Q8_K: {
            const auto& x = reinterpret_cast<const BlockQ8_K*>(row)[b / 8];
            return {x.qs + 32 * (b % 8), x.d, nullptr};
        }
        default: {
            const auto& x = reinterpret_cast<const BlockQ8_0*>(row)[b];
            return {x.qs, half_to_float(x.d), nullptr};
        }
    }
}

// The terms FastActBlock holds for one token's block b (src: its block in the quantized row).
struct ActTerms {
    float d, s;
    int32_t n, h;
};
ActTerms act_terms(const FastGemm& k, const SrcBlock& src) {
    int32_t lo = 0, hi = 0;
    for (int i = 0; i < 16; ++i) lo += src.q[i];
    for (int i = 16; i < 32; ++i) hi += src.q[i];
    return {src.d, src.s ? half_to_float(*src.s) : src.d * float(lo + hi), -k.offset * (lo + hi), -k.offset * lo};
}

}  // namespace

void fast_gemm_prepare(const FastGemm& k, const float* x, int64_t n_in, int32_t t_begin, int32_t t_end, int64_t b_begin,
                       int64_t b_end, uint8_t* act, SimdLevel level) {
    const int64_t nb = n_in / 32;
    thread_local std::vector<uint8_t> row;
    row.resize(row_bytes(k.act_type, (b_end - b_begin) * 32));
    auto* blocks = reinterpret_cast<FastActBlock*>(act);
    for (int32_t t = t_begin; t < t_end; ++t) {
        quantize_activations(k.act_type, x + t * n_in + b_begin * 32, row.data(), (b_end - b_begin) * 32, level);
        FastActBlock* tile = blocks + (t / kFastTok) * nb;
        const int slot = t % kFastTok;
        for (int64_t b = b_begin; b < b_end; ++b) {
            const SrcBlock src = src_block(k.act_type, row.data(), b - b_begin);
            const ActTerms a = act_terms(k, src);
            FastActBlock& dst = tile[b];
            std::memcpy(dst.q[slot], src.q, 32);
            dst.d[slot] = a.d;
            dst.s[slot] = a.s;
            dst.n[slot] = a.n;
            dst.h[slot] = a.h;
        }
    }
}

size_t fast_gemv_act_bytes(int64_t n_in) { return size_t(n_in + 64 + 3 * 4 * (n_in / 32)); }

FastActOne fast_gemv_act(const uint8_t* act, int64_t n_in) {
    const int64_t nb = n_in / 32;
    const auto* f = reinterpret_cast<const float*>(act + n_in + 64);
    return {reinterpret_cast<const int8_t*>(act), f, f + nb, reinterpret_cast<const int32_t*>(f + 2 * nb)};
}

void fast_gemv_prepare(const FastGemm& k, const float* x, int64_t n_in, uint8_t* act, SimdLevel level) {
    const int64_t nb = n_in / 32;
    thread_local std::vector<uint8_t> row;
    row.resize(row_bytes(k.act_type, n_in));
    quantize_activations(k.act_type, x, row.data(), n_in, level);
    std::memset(act + n_in, 0, 64);
    auto* f = reinterpret_cast<float*>(act + n_in + 64);
    auto* n = reinterpret_cast<int32_t*>(f + 2 * nb);
    for (int64_t b = 0; b < nb; ++b) {
        const SrcBlock src = src_block(k.act_type, row.data(), b);
        const ActTerms a = act_terms(k, src);
        std::memcpy(act + 32 * b, src.q, 32);
        f[b] = a.d;
        f[nb + b] = a.s;
        n[b] = a.n;
    }
}

}  // namespace ember
