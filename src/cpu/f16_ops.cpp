// f16 attention kernels through a 64 Ki-entry f16 -> f32 table (256 KiB, built once).
#include "cpu/f16_ops.h"

#include <vector>

#include "quant/half.h"

namespace ember {

namespace {
const float* f16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(1 << 16);
        for (uint32_t h = 0; h < (1u << 16); ++h) t[h] = half_to_float((uint16_t)h);
        return t;
    }();
    return table.data();
}
}  // namespace

float f16_dot(const float* a, const uint16_t* b, int n) {
    const float* t = f16_table();
    float s = 0.f;
    for (int i = 0; i < n; ++i) s += a[i] * t[b[i]];
    return s;
}

void f16_axpy(float w, const uint16_t* x, float* y, int n) {
    const float* t = f16_table();
    for (int i = 0; i < n; ++i) y[i] += w * t[x[i]];
}

}  // namespace ember
