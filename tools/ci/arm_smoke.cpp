// Smoke test of a cross-built core on a non-x86 target (tools/ci/arm_cross_check.sh runs it under
// qemu-user). On fresh random data (the seed is printed; pass it as the argument to repeat a run):
// for every quantized weight type, the CPU backend's matmul must equal the float dot products of
// the dequantized weights with the activations as vec_dot quantizes them, to float rounding; and
// each of the CPU's kernels must equal its scalar reference: the dot products (bit for bit for the
// quantized types, to float rounding for F32/F16/BF16), the activation quantizers (byte for byte)
// and the attention arithmetic (bit for bit). At the neon level every one of them must be a NEON
// kernel, so that a lookup falling back to scalar cannot pass unnoticed. Exits nonzero naming each
// mismatch.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "cpu/attention_math.h"
#include "cpu/cpu_kernels.h"
#include "ember/quant.h"
#include "quant/half.h"

using namespace ember;

namespace {

using Rng = std::mt19937;

// The level the CPU backend made here uses (EMBER_SIMD lowers it).
SimdLevel level() { return simd_level(Switches::current()); }
bool neon_level() { return level() == SimdLevel::neon; }

std::vector<float> normals(Rng& rng, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> normal;
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng) * scale;
    return v;
}

// A uniform exponent in [lo, hi): magnitudes that span many binades.
float pow10_uniform(Rng& rng, float lo, float hi) {
    return std::pow(10.0f, std::uniform_real_distribution<float>(lo, hi)(rng));
}

int check_matmul(Backend& cpu, GGMLType type, Rng& rng) {
    const TypeTraits& tr = type_traits(type);
    const int64_t n_in = 512, n_out = 19;
    const int32_t n_tok = 3;
    const std::vector<float> w = normals(rng, n_in * n_out), x = normals(rng, n_in * n_tok);
    std::vector<float> y(n_out * n_tok);
    std::vector<uint8_t> wq(row_bytes(type, n_in) * n_out);
    for (int64_t o = 0; o < n_out; ++o) tr.quantize_row(&w[o * n_in], &wq[o * row_bytes(type, n_in)], n_in);
    GGUFTensor t{"w", type, {n_in, n_out}, 0, wq.size(), wq.data()};
    const Weight weight = cpu.prepare_weight(t);
    cpu.matmul(weight, x.data(), n_tok, y.data());
    // Reference: dequantized weights x activations quantized to the vec_dot type, in double.
    const GGMLType act = cpu_kernels(type, level()).vec_dot_type;
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
                std::printf("FAIL matmul %s: token %d row %ld: %g, want %g\n", tr.name, k, long(o), y[k * n_out + o],
                            want);
                return 1;
            }
        }
    }
    std::printf("ok   matmul %s (x %s)\n", tr.name, at.name);
    return 0;
}

// Byte offsets of a block's fp16 scale fields (quant/blocks.h), which random weight bytes must
// keep finite.
std::vector<int> half_fields(GGMLType type) {
    switch (type) {
        case GGMLType::Q4_0:
        case GGMLType::Q5_0:
        case GGMLType::Q8_0:
        case GGMLType::IQ4_NL:
        case GGMLType::IQ4_XS:
        case GGMLType::IQ3_S:
        case GGMLType::IQ3_XXS:
        case GGMLType::IQ2_XXS:
        case GGMLType::IQ2_XS:
        case GGMLType::IQ2_S:
        case GGMLType::IQ1_S: return {0};
        case GGMLType::TQ1_0: return {52};
        case GGMLType::TQ2_0: return {64};
        case GGMLType::Q4_1:
        case GGMLType::Q5_1:
        case GGMLType::Q4_K:
        case GGMLType::Q5_K: return {0, 2};
        case GGMLType::Q6_K: return {208};
        case GGMLType::Q2_K: return {80, 82};
        case GGMLType::Q3_K: return {108};
        default: return {};
    }
}

// A row of n weights: quantized from normal floats, or random bytes, so that every bit pattern
// of the quants and scales occurs (Q8_0's -128, Q6_K's negative scales, all 6-bit K scales). A
// random fp16 (a scale, or an F16 / BF16 weight) has bit 14 cleared: exponent at most the bias,
// so finite and below 2 in magnitude.
std::vector<uint8_t> weight_row(GGMLType type, int64_t n, bool raw, Rng& rng) {
    const TypeTraits& tr = type_traits(type);
    std::vector<uint8_t> wq(row_bytes(type, n));
    if ((!raw || type == GGMLType::F32) && tr.quantize_row) {
        tr.quantize_row(normals(rng, n).data(), wq.data(), n);
        return wq;
    }
    for (uint8_t& b : wq) b = uint8_t(rng());
    auto finite_half = [&](size_t at) { wq[at + 1] &= 0xBF; };   // little-endian: bit 14 is bit 6 of the high byte
    if (type == GGMLType::F16 || type == GGMLType::BF16) {
        for (size_t at = 0; at < wq.size(); at += 2) finite_half(at);
        return wq;
    }
    for (size_t blk = 0; blk < wq.size(); blk += tr.block_bytes) {
        for (int off : half_fields(type)) finite_half(blk + off);
        if (type == GGMLType::MXFP4) wq[blk] = uint8_t(112 + wq[blk] % 32);   // e8m0 scales 2^-16 .. 2^15
        if (type == GGMLType::IQ1_M) wq[blk + 55] &= 0xBF;   // bit 14 of d: the top nibble of scale word 3
    }
    return wq;
}

// The CPU's best dot product of `type` against its scalar reference: bit for bit for the quantized
// types; for the float ones within the bound of two f32 sums of the same terms in other orders,
// (n + 16) * 2^-23 * sum|w x| (test_quant.py uses the same).
int check_vec_dot(GGMLType type, Rng& rng) {
    const TypeTraits& tr = type_traits(type);
    const CpuKernels& k = cpu_kernels(type, level());
    const TypeTraits& at = type_traits(k.vec_dot_type);
    const bool exact = tr.block_elems > 1;
    if (neon_level() && k.vec_dot == k.vec_dot_ref) {
        std::printf("FAIL vec_dot %s: no NEON kernel at the neon level\n", tr.name);
        return 1;
    }
    const std::vector<int64_t> sizes = !exact                 ? std::vector<int64_t>{1, 7, 16, 33, 100, 577, 4096}
                                       : tr.block_elems == 32 ? std::vector<int64_t>{32, 96, 160, 1056}
                                                              : std::vector<int64_t>{256, 768, 1280};
    for (int64_t n : sizes) {
        for (int trial = 0; trial < 2; ++trial) {
            const std::vector<uint8_t> wq = weight_row(type, n, trial == 1, rng);
            const std::vector<float> x = normals(rng, n, pow10_uniform(rng, -2, 2));
            std::vector<uint8_t> xq(row_bytes(k.vec_dot_type, n));
            at.quantize_row(x.data(), xq.data(), n);
            const float best = k.vec_dot(n, wq.data(), xq.data()), ref = k.vec_dot_ref(n, wq.data(), xq.data());
            bool ok;
            if (exact) {
                ok = std::memcmp(&best, &ref, sizeof(float)) == 0;
            } else {
                std::vector<float> wd(n);
                tr.dequantize_row(wq.data(), wd.data(), n);
                double l1 = 0;
                for (int64_t i = 0; i < n; ++i) l1 += std::fabs(double(wd[i]) * x[i]);
                ok = std::fabs(double(best) - ref) <= (n + 16) * 1.2e-7 * l1 + 1e-30;
            }
            if (!ok) {
                std::printf("FAIL vec_dot %s n=%ld (%s weights): %.9g, scalar reference %.9g\n", tr.name, long(n),
                            trial ? "random-byte" : "quantized", best, ref);
                return 1;
            }
        }
    }
    std::printf("ok   vec_dot %s equals the scalar reference%s (%s kernel)\n", tr.name, exact ? " bit for bit" : "",
                k.vec_dot == k.vec_dot_ref ? "scalar" : "SIMD");
    return 0;
}

// The CPU's activation quantizer against the scalar quantize_row, byte for byte: magnitudes from
// 1e-30 to 1e30, exact halfway quotients of both signs, zero blocks, a subnormal amax (1/d
// overflows), blocks with an infinity or a NaN.
int check_quantizer(GGMLType type, Rng& rng) {
    const TypeTraits& tr = type_traits(type);
    const QuantizeRowFn best = cpu_kernels(type, level()).quantize_row_best;
    if (neon_level() && best == tr.quantize_row) {
        std::printf("FAIL quantize %s: no NEON quantizer at the neon level\n", tr.name);
        return 1;
    }
    const int64_t blk = tr.block_elems;
    std::vector<std::vector<float>> rows;
    for (int r = 0; r < 6; ++r) rows.push_back(normals(rng, blk * (r + 3), pow10_uniform(rng, -30, 30)));
    std::vector<float> ties(blk * 2);
    for (int64_t j = 0; j < blk; ++j) {
        // with 127 (Q8_0/1) or -128 (Q8_K) in the block, x / d = x: every other value a .5 tie
        ties[j] = float(j % 64) - 31.5f;
        ties[blk + j] = -ties[j];
    }
    ties[blk - 1] = blk == 32 ? 127.0f : -128.0f;
    ties[2 * blk - 1] = blk == 32 ? -127.0f : -128.0f;
    std::vector<float> odd = normals(rng, blk * 5);
    std::fill(odd.begin(), odd.begin() + blk, 0.0f);   // a zero block
    std::fill(odd.begin() + blk, odd.begin() + 2 * blk, 0.0f);
    odd[blk + 5] = 1e-45f;                   // subnormal amax
    odd[2 * blk + 3] = INFINITY;             // non-finite blocks take the scalar path
    odd[3 * blk + 7] = NAN;
    odd[4 * blk + 9] = 9.0f;                 // equal largest magnitudes: the first one sets Q8_K's scale
    odd[4 * blk + 1] = -9.0f;
    rows.push_back(ties);
    rows.push_back(odd);
    for (const std::vector<float>& x : rows) {
        const int64_t n = int64_t(x.size());
        std::vector<uint8_t> got(row_bytes(type, n)), want(row_bytes(type, n));
        best(x.data(), got.data(), n);
        tr.quantize_row(x.data(), want.data(), n);
        if (got != want) {
            std::printf("FAIL quantize %s: a row of %ld values differs from the scalar bytes\n", tr.name, long(n));
            return 1;
        }
    }
    std::printf("ok   quantize %s equals the scalar bytes (%s)\n", tr.name,
                best == tr.quantize_row ? "scalar" : "SIMD");
    return 0;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<uint16_t> halves(Rng& rng, size_t n) {
    std::vector<uint16_t> h(n);
    for (uint16_t& v : h) v = float_to_half(std::normal_distribution<float>()(rng));
    return h;
}

// The dispatched attention arithmetic (attention_math(D)) against the scalar table.
int check_attention(Rng& rng) {
    const AttentionMath& ref = kAttentionMathScalar;
    const AttentionMath& best = attention_math(64, level());
    if (neon_level() && best.scores == ref.scores) {
        std::printf("FAIL attention: the scalar arithmetic at the neon level\n");
        return 1;
    }
    auto fail = [](const char* what, long a, long b) {
        std::printf("FAIL attention %s (%ld, %ld) differs from the scalar reference\n", what, a, b);
        return 1;
    };
    constexpr int L = kAttentionLanes;
    for (int32_t D : {16, 32, 48, 64, 80, 128}) {
        const AttentionMath& m = attention_math(D, level());
        for (int32_t groups : {1, 3, 4, 7}) {
            const std::vector<float> q = normals(rng, D), kt = normals(rng, size_t(groups) * D * L);
            std::vector<float> a(groups * L), b(groups * L);
            m.scores(q.data(), kt.data(), D, groups, 0.125f, a.data());
            ref.scores(q.data(), kt.data(), D, groups, 0.125f, b.data());
            if (!same_bits(a, b)) return fail("scores D, groups", D, groups);
        }
        for (int32_t len : {1, 5, 33}) {
            const std::vector<float> w = normals(rng, len), v = normals(rng, size_t(len) * D);
            std::vector<float> a(D), b(D);
            m.weighted_sum(w.data(), v.data(), D, len, a.data());
            ref.weighted_sum(w.data(), v.data(), D, len, b.data());
            if (!same_bits(a, b)) return fail("weighted_sum D, len", D, len);
            for (int32_t heads : {1, 3, 4, 6}) {
                const std::vector<float> wh = normals(rng, size_t(heads) * len);
                const std::vector<uint16_t> vh = halves(rng, size_t(len) * (D + 8));
                std::vector<const uint16_t*> rows(len);
                for (int32_t p = 0; p < len; ++p) rows[p] = vh.data() + size_t(p) * (D + 8);
                std::vector<float> c(size_t(heads) * D), d(size_t(heads) * D);
                m.weighted_sum_f16(wh.data(), len, heads, rows.data(), D, len, c.data(), D);
                ref.weighted_sum_f16(wh.data(), len, heads, rows.data(), D, len, d.data(), D);
                if (!same_bits(c, d)) return fail("weighted_sum_f16 D, heads", D, heads);
            }
        }
        const int64_t stride = 3 * D + 8;
        const std::vector<uint16_t> rows = halves(rng, size_t(L) * stride);
        std::vector<float> a(size_t(D) * L), b(size_t(D) * L);
        m.gather_keys16_f16(rows.data(), stride, D, a.data());
        ref.gather_keys16_f16(rows.data(), stride, D, b.data());
        if (!same_bits(a, b)) return fail("gather_keys16_f16 D, stride", D, long(stride));
    }
    // f16 rounding: values from f16 subnormals past f16 overflow, and exact halfway points
    for (int32_t n : {1, 3, 4, 16, 37, 130}) {
        std::vector<float> x(n);
        for (float& v : x) v = std::normal_distribution<float>()(rng) * pow10_uniform(rng, -9, 6);
        for (int32_t j = 0; j < n; j += 3) {
            const uint16_t h = uint16_t(rng() % 0x7BFF) | uint16_t(rng() & 0x8000);
            x[j] = 0.5f * (half_to_float(h) + half_to_float(uint16_t(h + 1)));
        }
        for (float mul : {1.0f, 0.3f}) {
            for (bool to_f16 : {false, true}) {
                std::vector<float> a(n), b(n);
                best.scale_round(x.data(), n, mul, to_f16, a.data());
                ref.scale_round(x.data(), n, mul, to_f16, b.data());
                if (!same_bits(a, b)) return fail("scale_round n, to_f16", n, to_f16);
            }
        }
    }
    // every f16 bit pattern, the last call with a tail; a NaN only has to stay NaN (a signalling
    // one comes back quiet from the conversion instruction; float_to_half never stores one)
    std::vector<uint16_t> all(65536);
    for (int i = 0; i < 65536; ++i) all[i] = uint16_t(i);
    for (int32_t n : {65536, 65533}) {
        std::vector<float> a(n), b(n);
        best.f16_to_f32(all.data(), n, a.data());
        ref.f16_to_f32(all.data(), n, b.data());
        for (int32_t j = 0; j < n; ++j) {
            const bool nan = std::isnan(b[j]);
            if (nan ? !std::isnan(a[j]) : std::memcmp(&a[j], &b[j], 4) != 0) return fail("f16_to_f32 n, bits", n, j);
        }
    }
    // the maximum skips NaNs (-inf when nothing else); a zero's sign may depend on the order
    for (int32_t n : {1, 5, 16, 17, 75, 130, 130, 130}) {
        std::vector<float> x = normals(rng, n);
        for (float& v : x)
            if (rng() % 8 == 0) v = NAN;
        x[0] = NAN;
        if (n > 2) x[n - 2] = -INFINITY;
        const float a = best.max(x.data(), n), b = ref.max(x.data(), n);
        if (!(a == b)) return fail("max n", n, 0);
        std::fill(x.begin(), x.end(), NAN);
        if (best.max(x.data(), n) != -INFINITY) return fail("max of NaNs n", n, 0);
    }
    std::printf("ok   attention arithmetic equals the scalar reference (%s)\n",
                best.scores == ref.scores ? "scalar" : "SIMD");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned seed = argc > 1 ? unsigned(std::strtoul(argv[1], nullptr, 10)) : std::random_device()();
    std::printf("seed %u\n", seed);
    Rng rng(seed);
    BackendOptions opts;
    opts.n_threads = 2;
    std::unique_ptr<Backend> cpu = make_backend("cpu", opts);
    std::printf("SIMD level %d (0 scalar, 1 avx2, 2 avx512, 3 neon)\n", int(level()));
    int bad = 0;
    for (GGMLType t :
         {GGMLType::Q4_0,    GGMLType::Q4_1,   GGMLType::Q5_0,   GGMLType::Q5_1,   GGMLType::Q8_0,  GGMLType::Q2_K,
          GGMLType::Q3_K,    GGMLType::Q4_K,   GGMLType::Q5_K,   GGMLType::Q6_K,   GGMLType::F32,   GGMLType::F16,
          GGMLType::BF16,    GGMLType::MXFP4,  GGMLType::IQ4_NL, GGMLType::IQ4_XS, GGMLType::IQ3_S, GGMLType::IQ3_XXS,
          GGMLType::IQ2_XXS, GGMLType::IQ2_XS, GGMLType::IQ2_S,  GGMLType::IQ1_S,  GGMLType::IQ1_M, GGMLType::TQ1_0,
          GGMLType::TQ2_0,   GGMLType::NVFP4})
        bad += check_vec_dot(t, rng);
    for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q8_1, GGMLType::Q8_K}) bad += check_quantizer(t, rng);
    bad += check_attention(rng);
    for (GGMLType t : {GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q8_0, GGMLType::Q2_K,
                       GGMLType::Q3_K, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K, GGMLType::F16, GGMLType::MXFP4})
        bad += check_matmul(*cpu, t, rng);
    if (bad) std::printf("%d failed (seed %u)\n", bad, seed);
    else std::printf("all passed\n");
    return bad ? 1 : 0;
}
