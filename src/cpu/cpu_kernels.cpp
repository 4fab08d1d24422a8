// The CPU kernel table (type -> vec_dot type, reference and best dot, best activation quantizer)
// and the one-time choice of SIMD level (CPU features, lowered by EMBER_SIMD).
#include "cpu/cpu_kernels.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/isa_kernels.h"
#include "ember/status.h"

namespace ember {
namespace {

SimdLevel detect_simd() {
    SimdLevel level = SimdLevel::scalar;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) level = SimdLevel::avx2;
    if (level == SimdLevel::avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni")) {
        level = SimdLevel::avx512;
    }
#elif defined(__aarch64__)
    level = SimdLevel::neon;
#endif
    // EMBER_SIMD may only lower the level (tests compare the paths on one machine): to scalar, or on
    // x86 to a lower x86 level. The x86 levels are no lower than neon on ARM, nor neon on x86.
    if (const char* env = std::getenv("EMBER_SIMD")) {
        SimdLevel want = level;
        if (std::strcmp(env, "scalar") == 0) want = SimdLevel::scalar;
        else if (std::strcmp(env, "avx2") == 0) want = SimdLevel::avx2;
        else if (std::strcmp(env, "avx512") == 0) want = SimdLevel::avx512;
        else if (std::strcmp(env, "neon") == 0) want = SimdLevel::neon;
        else fail("EMBER_SIMD must be 'scalar', 'avx2', 'avx512' or 'neon', got '", env, "'");
        const bool x86_below = level != SimdLevel::neon && want != SimdLevel::neon && int(want) < int(level);
        if (want == SimdLevel::scalar || x86_below) level = want;
    }
    return level;
}

VecDotFn best_vec_dot(GGMLType t) {
    VecDotFn f = nullptr;
    if (cpu_simd_level() == SimdLevel::neon) f = vec_dot_neon(t);
    if (!f && cpu_simd_level() == SimdLevel::avx512) f = vec_dot_avx512(t);
    if (!f && int(cpu_simd_level()) >= int(SimdLevel::avx2)) f = vec_dot_avx2(t);
    return f ? f : vec_dot_scalar(t);
}

QuantizeRowFn best_quantize_row(GGMLType t) {
    const QuantizeRowFn scalar = type_traits(t).quantize_row;
    if (!scalar) return nullptr;
    QuantizeRowFn f = cpu_simd_level() == SimdLevel::neon ? quantize_row_neon(t) : nullptr;
    if (!f && cpu_simd_level() == SimdLevel::avx512) f = quantize_row_avx512(t);
    if (!f && int(cpu_simd_level()) >= int(SimdLevel::avx2)) f = quantize_row_avx2(t);
    return f ? f : scalar;
}

struct Row {
    GGMLType type;
    CpuKernels k;
};

Row row(GGMLType t, GGMLType vec_dot_type) {
    return Row{t, CpuKernels{vec_dot_type, vec_dot_scalar(t), best_vec_dot(t), best_quantize_row(t)}};
}

const std::vector<Row>& table() {
    using T = GGMLType;
    static const std::vector<Row> rows = {
        row(T::F32, T::F32),   row(T::F16, T::F32),   row(T::BF16, T::F32),  row(T::Q4_0, T::Q8_0),
        row(T::Q4_1, T::Q8_1), row(T::Q5_0, T::Q8_0), row(T::Q5_1, T::Q8_1), row(T::Q8_0, T::Q8_0),
        row(T::Q8_1, T::Q8_1), row(T::Q2_K, T::Q8_K), row(T::Q3_K, T::Q8_K), row(T::Q4_K, T::Q8_K),
        row(T::Q5_K, T::Q8_K), row(T::Q6_K, T::Q8_K), row(T::Q8_K, T::Q8_K),
    };
    return rows;
}

}  // namespace

SimdLevel cpu_simd_level() {
    static const SimdLevel level = detect_simd();
    return level;
}

const CpuKernels& cpu_kernels(GGMLType type) {
    for (const Row& r : table()) {
        if (r.type == type) return r.k;
    }
    fail("cpu: no kernels for ggml type id ", uint32_t(type));
}

void quantize_activations(GGMLType vec_dot_type, const float* x, void* dst, int64_t n) {
    row_bytes(vec_dot_type, n);   // validates n
    const QuantizeRowFn q = cpu_kernels(vec_dot_type).quantize_row_best;
    if (!q) fail("cpu: no quantizer for activation type ", type_traits(vec_dot_type).name);
    q(x, dst, n);
}

}  // namespace ember
