// The CPU kernel tables, one per SIMD level (type -> vec_dot type, reference and best dot, best
// activation quantizer), and the level a backend's switches choose (CPU features, lowered by EMBER_SIMD).
#include "cpu/cpu_kernels.h"

#include <array>
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
    return level;
}

VecDotFn best_vec_dot(GGMLType t, SimdLevel level) {
    VecDotFn f = nullptr;
    if (level == SimdLevel::neon) f = vec_dot_neon(t);
    if (!f && level == SimdLevel::avx512) f = vec_dot_avx512(t);
    if (!f && (level == SimdLevel::avx2 || level == SimdLevel::avx512)) f = vec_dot_avx2(t);
    return f ? f : vec_dot_scalar(t);
}

QuantizeRowFn best_quantize_row(GGMLType t, SimdLevel level) {
    const QuantizeRowFn scalar = type_traits(t).quantize_row;
    if (!scalar) return nullptr;
    QuantizeRowFn f = level == SimdLevel::neon ? quantize_row_neon(t) : nullptr;
    if (!f && level == SimdLevel::avx512) f = quantize_row_avx512(t);
    if (!f && (level == SimdLevel::avx2 || level == SimdLevel::avx512)) f = quantize_row_avx2(t);
    return f ? f : scalar;
}

struct Row {
    GGMLType type;
    CpuKernels k;
};

std::vector<Row> make_table(SimdLevel level) {
    using T = GGMLType;
    const std::pair<T, T> types[] = {
        {T::F32, T::F32},      {T::F16, T::F32},     {T::BF16, T::F32},    {T::Q4_0, T::Q8_0},  {T::Q4_1, T::Q8_1},
        {T::Q5_0, T::Q8_0},    {T::Q5_1, T::Q8_1},   {T::Q8_0, T::Q8_0},   {T::Q8_1, T::Q8_1},  {T::Q2_K, T::Q8_K},
        {T::Q3_K, T::Q8_K},    {T::Q4_K, T::Q8_K},   {T::Q5_K, T::Q8_K},   {T::Q6_K, T::Q8_K},  {T::Q8_K, T::Q8_K},
        {T::MXFP4, T::Q8_0},   {T::IQ4_NL, T::Q8_0}, {T::IQ4_XS, T::Q8_K}, {T::IQ3_S, T::Q8_K}, {T::IQ3_XXS, T::Q8_K},
        {T::IQ2_XXS, T::Q8_K}, {T::IQ2_XS, T::Q8_K}, {T::IQ2_S, T::Q8_K},  {T::IQ1_S, T::Q8_K}, {T::IQ1_M, T::Q8_K},
        {T::TQ1_0, T::Q8_K},   {T::TQ2_0, T::Q8_K},  {T::NVFP4, T::Q8_0},
    };
    std::vector<Row> rows;
    for (const auto& [t, vec_dot_type] : types)
        rows.push_back(
            Row{t, CpuKernels{vec_dot_type, vec_dot_scalar(t), best_vec_dot(t, level), best_quantize_row(t, level)}});
    return rows;
}

// Every level's table, built once: a level above the CPU's is never asked for (simd_level only
// lowers), so its entries are never called.
const std::vector<Row>& table(SimdLevel level) {
    static const std::array<std::vector<Row>, 4> tables = {make_table(SimdLevel::scalar), make_table(SimdLevel::avx2),
                                                           make_table(SimdLevel::avx512), make_table(SimdLevel::neon)};
    return tables[size_t(level)];
}

}  // namespace

SimdLevel detected_simd_level() {
    static const SimdLevel level = detect_simd();
    return level;
}

SimdLevel simd_level(const Switches& switches) {
    const SimdLevel level = detected_simd_level();
    const std::string& v = switches.get("EMBER_SIMD");
    if (v.empty()) return level;
    // The x86 levels are no lower than neon on ARM, nor neon on x86 (the table checked the name).
    const SimdLevel want = v == "scalar"   ? SimdLevel::scalar
                           : v == "avx2"   ? SimdLevel::avx2
                           : v == "avx512" ? SimdLevel::avx512
                                           : SimdLevel::neon;
    const bool x86_below = level != SimdLevel::neon && want != SimdLevel::neon && int(want) < int(level);
    return want == SimdLevel::scalar || x86_below ? want : level;
}

const char* simd_level_name(SimdLevel level) {
    switch (level) {
        case SimdLevel::avx512: return "avx512";
        case SimdLevel::avx2: return "avx2";
        case SimdLevel::neon: return "neon";
        case SimdLevel::scalar: break;
    }
    return "scalar";
}

const CpuKernels& cpu_kernels(GGMLType type, SimdLevel level) {
    for (const Row& r : table(level)) {
        if (r.type == type) return r.k;
    }
    fail("cpu: no kernels for ggml type id ", uint32_t(type));
}

void quantize_activations(GGMLType vec_dot_type, const float* x, void* dst, int64_t n, SimdLevel level) {
    row_bytes(vec_dot_type, n);   // validates n
    const QuantizeRowFn q = cpu_kernels(vec_dot_type, level).quantize_row_best;
    if (!q) fail("cpu: no quantizer for activation type ", type_traits(vec_dot_type).name);
    q(x, dst, n);
}

}  // namespace ember
