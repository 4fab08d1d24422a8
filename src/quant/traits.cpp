// The type traits table (type -> block geometry, scalar dequantize/quantize, vec_dot kernels)
// and the one-time choice of SIMD level for vec_dot (CPU features, lowered by EMBER_SIMD).
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ember/status.h"
#include "quant/kernels.h"

namespace ember {
namespace {

enum class Simd { scalar = 0, avx2 = 1, avx512 = 2 };

Simd detect_simd() {
    Simd level = Simd::scalar;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) level = Simd::avx2;
    if (level == Simd::avx2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni")) {
        level = Simd::avx512;
    }
#endif
    // EMBER_SIMD may only lower the level (tests compare the paths on one machine).
    if (const char* env = std::getenv("EMBER_SIMD")) {
        Simd want = level;
        if (std::strcmp(env, "scalar") == 0) want = Simd::scalar;
        if (std::strcmp(env, "avx2") == 0) want = Simd::avx2;
        if (std::strcmp(env, "avx512") == 0) want = Simd::avx512;
        if (int(want) < int(level)) level = want;
    }
    return level;
}

Simd simd() {
    static const Simd level = detect_simd();
    return level;
}

VecDotFn best_vec_dot(GGMLType t) {
    VecDotFn f = nullptr;
    if (simd() == Simd::avx512) f = vec_dot_avx512(t);
    if (!f && int(simd()) >= int(Simd::avx2)) f = vec_dot_avx2(t);
    return f ? f : vec_dot_scalar(t);
}

QuantizeRowFn best_quantize_row(GGMLType t, QuantizeRowFn scalar) {
    QuantizeRowFn f = simd() == Simd::avx512 ? quantize_row_avx512(t) : nullptr;
    if (!f && int(simd()) >= int(Simd::avx2)) f = quantize_row_avx2(t);
    return f ? f : scalar;
}

TypeTraits row(GGMLType t, const char* name, int elems, int bytes, DequantizeRowFn dq,
               QuantizeRowFn q, GGMLType vdt) {
    return TypeTraits{t, name, elems, bytes, dq, q, vdt, vec_dot_scalar(t), best_vec_dot(t), best_quantize_row(t, q)};
}

const std::vector<TypeTraits>& table() {
    using T = GGMLType;
    static const std::vector<TypeTraits> rows = {
        row(T::F32, "F32", 1, 4, dequantize_row_f32, quantize_row_f32, T::F32),
        row(T::F16, "F16", 1, 2, dequantize_row_f16, quantize_row_f16, T::F32),
        row(T::BF16, "BF16", 1, 2, dequantize_row_bf16, quantize_row_bf16, T::F32),
        row(T::Q4_0, "Q4_0", 32, 18, dequantize_row_q4_0, quantize_row_q4_0, T::Q8_0),
        row(T::Q4_1, "Q4_1", 32, 20, dequantize_row_q4_1, quantize_row_q4_1, T::Q8_1),
        row(T::Q5_0, "Q5_0", 32, 22, dequantize_row_q5_0, quantize_row_q5_0, T::Q8_0),
        row(T::Q5_1, "Q5_1", 32, 24, dequantize_row_q5_1, quantize_row_q5_1, T::Q8_1),
        row(T::Q8_0, "Q8_0", 32, 34, dequantize_row_q8_0, quantize_row_q8_0, T::Q8_0),
        row(T::Q8_1, "Q8_1", 32, 36, dequantize_row_q8_1, quantize_row_q8_1, T::Q8_1),
        row(T::Q2_K, "Q2_K", 256, 84, dequantize_row_q2_k, nullptr, T::Q8_K),
        row(T::Q3_K, "Q3_K", 256, 110, dequantize_row_q3_k, nullptr, T::Q8_K),
        row(T::Q4_K, "Q4_K", 256, 144, dequantize_row_q4_k, quantize_row_q4_k, T::Q8_K),
        row(T::Q5_K, "Q5_K", 256, 176, dequantize_row_q5_k, quantize_row_q5_k, T::Q8_K),
        row(T::Q6_K, "Q6_K", 256, 210, dequantize_row_q6_k, quantize_row_q6_k, T::Q8_K),
        row(T::Q8_K, "Q8_K", 256, 292, dequantize_row_q8_k, quantize_row_q8_k, T::Q8_K),
    };
    return rows;
}

}  // namespace

const TypeTraits* find_type_traits(uint32_t type_id) {
    for (const TypeTraits& t : table()) {
        if (uint32_t(t.type) == type_id) return &t;
    }
    return nullptr;
}

const TypeTraits& type_traits(GGMLType type) {
    const TypeTraits* t = find_type_traits(uint32_t(type));
    if (!t) fail("quant: unknown or unsupported ggml type id ", uint32_t(type));
    return *t;
}

size_t row_bytes(GGMLType type, int64_t n) {
    const TypeTraits& t = type_traits(type);
    if (n < 0 || n % t.block_elems != 0) {
        fail("quant: row of ", n, " elements is not a whole number of ", t.name, " blocks (",
             t.block_elems, " elements each)");
    }
    return size_t(n / t.block_elems) * size_t(t.block_bytes);
}

const char* simd_level() {
    switch (simd()) {
        case Simd::avx512: return "avx512";
        case Simd::avx2: return "avx2";
        case Simd::scalar: break;
    }
    return "scalar";
}

}  // namespace ember
