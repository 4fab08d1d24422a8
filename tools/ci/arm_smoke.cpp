// Smoke test of a cross-built core on a non-x86 target (tools/ci/arm_cross_check.sh runs it under
// qemu-user): for every quantized weight type, the CPU backend's matmul on random data must equal
// the float dot products of the dequantized weights with the activations as vec_dot quantizes
// them, to float rounding; and the NEON dot products (Q4_0, Q4_1, Q8_0) must equal the scalar
// reference bit for bit. Exits nonzero naming each mismatch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "cpu/cpu_kernels.h"
#include "ember/quant.h"

using namespace ember;

namespace {

int check_matmul(Backend& cpu, GGMLType type, std::mt19937& rng) {
    const TypeTraits& tr = type_traits(type);
    const int64_t n_in = 512, n_out = 19;
    const int32_t n_tok = 3;
    std::normal_distribution<float> normal;
    std::vector<float> w(n_in * n_out), x(n_in * n_tok), y(n_out * n_tok);
    for (float& v : w) v = normal(rng);
    for (float& v : x) v = normal(rng);
    std::vector<uint8_t> wq(row_bytes(type, n_in) * n_out);
    for (int64_t o = 0; o < n_out; ++o) tr.quantize_row(&w[o * n_in], &wq[o * row_bytes(type, n_in)], n_in);
    GGUFTensor t{"w", type, {n_in, n_out}, 0, wq.size(), wq.data()};
    const Weight weight = cpu.prepare_weight(t);
    cpu.matmul(weight, x.data(), n_tok, y.data());
    // Reference: dequantized weights x activations quantized to the vec_dot type, in double.
    const GGMLType act = cpu_kernels(type).vec_dot_type;
    const TypeTraits& at = type_traits(act);
    std::vector<float> wd(n_in), xd(n_in);
    std::vector<uint8_t> xq(row_bytes(act, n_in));
    for (int32_t k = 0; k < n_tok; ++k) {
        at.quantize_row(&x[k * n_in], xq.data(), n_in);
        at.dequantize_row(xq.data(), xd.data(), n_in);
        for (int64_t o = 0; o < n_out; ++o) {
            tr.dequantize_row(&wq[o * row_bytes(type, n_in)], wd.data(), n_in);
            double want = 0, scale = 0;
            for (int64_t i = 0; i < n_in; ++i) {
                want += double(wd[i]) * xd[i];
                scale += std::fabs(double(wd[i]) * xd[i]);
            }
            // Q4_1 / Q5_1 fold the activations' sums as fp16 (Q8_1), a little looser.
            if (std::fabs(y[k * n_out + o] - want) > 2e-3 * scale + 1e-4) {
                std::printf("FAIL matmul %s: token %d row %ld: %g, want %g\n", tr.name, k, long(o),
                            y[k * n_out + o], want);
                return 1;
            }
        }
    }
    std::printf("ok   matmul %s (x %s)\n", tr.name, at.name);
    return 0;
}

// The CPU's best dot product of `type` against its scalar reference, bit for bit.
int check_vec_dot_bits(GGMLType type, std::mt19937& rng) {
    const TypeTraits& tr = type_traits(type);
    const CpuKernels& k = cpu_kernels(type);
    const TypeTraits& at = type_traits(k.vec_dot_type);
    const int64_t n = 1024;
    std::normal_distribution<float> normal;
    std::vector<float> w(n), x(n);
    for (float& v : w) v = normal(rng);
    for (float& v : x) v = normal(rng);
    std::vector<uint8_t> wq(row_bytes(type, n)), xq(row_bytes(k.vec_dot_type, n));
    tr.quantize_row(w.data(), wq.data(), n);
    at.quantize_row(x.data(), xq.data(), n);
    const float best = k.vec_dot(n, wq.data(), xq.data()), ref = k.vec_dot_ref(n, wq.data(), xq.data());
    if (std::memcmp(&best, &ref, sizeof(float)) != 0) {
        std::printf("FAIL vec_dot %s: %.9g, scalar reference %.9g\n", tr.name, best, ref);
        return 1;
    }
    std::printf("ok   vec_dot %s equals the scalar reference (%s kernel)\n", tr.name,
                k.vec_dot == k.vec_dot_ref ? "scalar" : "SIMD");
    return 0;
}

}  // namespace

int main() {
    std::mt19937 rng(1234);
    BackendOptions opts;
    opts.n_threads = 2;
    std::unique_ptr<Backend> cpu = make_backend("cpu", opts);
    std::printf("SIMD level %d (0 scalar, 1 avx2, 2 avx512, 3 neon)\n", int(cpu_simd_level()));
    int bad = 0;
    for (GGMLType t : {GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q8_0}) bad += check_vec_dot_bits(t, rng);
    for (GGMLType t : {GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q8_0,
                       GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K, GGMLType::F16})
        bad += check_matmul(*cpu, t, rng);
    std::printf(bad ? "%d failed\n" : "all passed\n", bad);
    return bad ? 1 : 0;
}
