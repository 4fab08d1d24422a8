// IQ4_NL's quantizer as ggml's reference (quantize_row_iq4_nl_ref, which its iq4_nl KV cache stores
// with): per block of 32, d from the value of largest magnitude over the table's first level, each
// value to its nearest level, then the weighted least-squares d of those levels (weights x^2).
#include <cmath>

#include "quant/decode.h"
#include "quant/kernels.h"

// ggml rounds each product and sum on its own (no fused multiply-add).
#pragma GCC optimize("fp-contract=off")

namespace ember {
namespace {

// The index of the level of kvalues_iq4nl nearest x; a tie goes to the upper level.
int nearest_level(float x) {
    const int8_t* v = kvalues_iq4nl;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid]) hi = mid;
        else lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

}  // namespace

// A block whose largest magnitude is below 1e-15 is stored as d = 0 (every value 0).
void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
    BlockIQ4_NL* b = static_cast<BlockIQ4_NL*>(dst);
    for (int64_t i = 0; i < n / QK4_0; ++i, src += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; ++j) {
            const float ax = std::fabs(src[j]);
            if (ax > amax) {
                amax = ax;
                max = src[j];
            }
        }
        uint8_t level[QK4_0] = {};
        float d = 0.0f;
        if (amax >= 1e-15f) {
            const float id = 1.0f / (max / float(kvalues_iq4nl[0]));
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int j = 0; j < QK4_0; ++j) {
                level[j] = uint8_t(nearest_level(id * src[j]));
                const float q = float(kvalues_iq4nl[level[j]]), w = src[j] * src[j];
                sumqx += w * q * src[j];
                sumq2 += w * q * q;
            }
            d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
        }
        b[i].d = float_to_half(d);
        for (int j = 0; j < 16; ++j) b[i].qs[j] = uint8_t(level[j] | level[j + 16] << 4);
    }
}

}  // namespace ember
