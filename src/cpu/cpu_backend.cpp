// CPU backend memory, weight binding and the elementwise ops (norms, rope, gated activations, add).
#include "cpu/cpu_backend.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include <sys/mman.h>

#include "backend/greedy_token.h"
#include "backend/registry.h"
#include "cpu/cpu_moe.h"
#include "cpu/isa_kernels.h"
#include "ember/status.h"
#include "backend/rope_angles.h"

namespace ember {

CpuBackend::CpuBackend(int n_threads, const Switches& switches)
    : handout_bytes_(size_t(switches.integer("EMBER_CPU_HANDOUT_KB")) << 10), simd_(simd_level(switches)),
      fast_level_(switches.on("EMBER_CPU_FAST_GEMM") ? simd_ : SimdLevel::scalar), pool_(n_threads) {}

void* CpuBackend::alloc(size_t bytes) {
    // Buffers of 2 MiB and more (the KV pool above all, whose blocks attention visits in the
    // order of each sequence's block table) go on transparent huge pages where the kernel has
    // them: with 4 KiB pages nearly every block a decode step reads is a TLB miss.
    constexpr size_t kHugePage = size_t(2) << 20;
    const bool huge = bytes >= kHugePage;
    const size_t align = huge ? kHugePage : 64;
    const size_t size = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, size);
    if (!p) throw OutOfMemory(cat("cannot allocate ", bytes / (1 << 20), " MiB of host memory"));
#ifdef MADV_HUGEPAGE
    if (huge) ::madvise(p, size, MADV_HUGEPAGE);   // a hint: kernels without THP ignore it
#endif
    return p;
}

void CpuBackend::free(void* p) { std::free(p); }
void CpuBackend::copy_from_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

Weight CpuBackend::prepare_weight(const GGUFTensor& t) {
    Weight w;
    w.type = t.type;
    w.n_in = t.ne[0];
    w.n_out = t.n_rows();
    w.data = t.data;
    w.src = &t;
    if (t.ne.size() == 3) {   // stacked experts [n_expert][n_out][n_in]
        w.n_out = t.ne[1];
        w.n_expert = int32_t(t.ne[2]);
        w.expert_stride = row_bytes(t.type, t.ne[0]) * size_t(t.ne[1]);
    }
    return w;
}

const float* CpuBackend::prepare_vector(const GGUFTensor& t) {
    if (t.type == GGMLType::F32) return reinterpret_cast<const float*>(t.data);
    const TypeTraits& tr = type_traits(t.type);
    f32_vectors_.emplace_back(t.n_elements());
    tr.dequantize_row(t.data, f32_vectors_.back().data(), t.n_elements());
    return f32_vectors_.back().data();
}

namespace {
// One row y = x / rms(x) * gamma (gamma null: none), the sum of squares in double (rows may alias: x
// is read first).
void rmsnorm_row(const float* x, const float* gamma, int32_t dim, float eps, float* y) {
    double ss = 0.0;
    for (int32_t i = 0; i < dim; ++i) ss += (double)x[i] * x[i];
    const float scale = 1.0f / std::sqrt((float)(ss / dim) + eps);
    if (!gamma) {
        for (int32_t i = 0; i < dim; ++i) y[i] = x[i] * scale;
        return;
    }
    for (int32_t i = 0; i < dim; ++i) y[i] = x[i] * scale * gamma[i];
}
}  // namespace

void CpuBackend::rmsnorm(const float* x, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y) {
    for (int32_t t = 0; t < n_tok; ++t) rmsnorm_row(x + (int64_t)t * dim, gamma, dim, eps, y + (int64_t)t * dim);
}

void CpuBackend::head_rmsnorm(float* x, const float* gamma, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                              float eps) {
    for (int64_t r = 0; r < (int64_t)n_tok * n_heads; ++r)
        rmsnorm_row(x + r * head_dim, gamma, head_dim, eps, x + r * head_dim);
}

void CpuBackend::rmsnorm_grouped(const float* x, const float* gamma, int32_t n_rows, int64_t width, int32_t n_groups,
                                 float eps, float* y) {
    if (n_rows < 0 || n_groups <= 0 || width <= 0 || width % n_groups != 0)
        fail("rmsnorm_grouped: width ", width, " must be a positive multiple of n_groups ", n_groups, ", n_rows ",
             n_rows, " not negative");
    const int64_t group = width / n_groups;
    pool_.parallel_for((int64_t)n_rows * n_groups, 16, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            const float* v = x + r * group;
            const float* g = gamma + r % n_groups * group;
            float* o = y + r * group;
            double ss = 0.0;
            for (int64_t i = 0; i < group; ++i) ss += (double)v[i] * v[i];
            const float scale = (float)(1.0 / std::sqrt(ss / (double)group + eps));
            for (int64_t i = 0; i < group; ++i) o[i] = v[i] * scale * g[i];
        }
    });
}

void CpuBackend::rope(float* x, int32_t n_tok, int32_t n_heads, const RopeParams& rope) {
    // llama layout rotates adjacent pairs (2i, 2i+1); neox rotates (i, i + n_rot/2). Dimensions
    // past n_rot pass through.
    const int32_t head_dim = rope.head_dim, half = rope.rotated() / 2;
    std::vector<float> cos_t(half), sin_t(half);
    for (int32_t t = 0; t < n_tok; ++t) {
        for (int32_t i = 0; i < half; ++i) rope_cos_sin(batch_.pos[t], i, rope, cos_t[i], sin_t[i]);
        for (int32_t h = 0; h < n_heads; ++h) {
            float* v = x + ((int64_t)t * n_heads + h) * head_dim;
            for (int32_t i = 0; i < half; ++i) {
                const int32_t a = rope.neox ? i : 2 * i, b = rope.neox ? i + half : 2 * i + 1;
                const float x0 = v[a], x1 = v[b];
                v[a] = x0 * cos_t[i] - x1 * sin_t[i];
                v[b] = x0 * sin_t[i] + x1 * cos_t[i];
            }
        }
    }
}

void CpuBackend::attn_temperature(float* q, int32_t n_tok, int64_t width, const RopeParams& rope) {
    for (int32_t t = 0; t < n_tok; ++t) {
        const float s = rope_temperature(batch_.pos[t], rope);
        for (int64_t i = 0; i < width; ++i) q[t * width + i] *= s;
    }
}

void gated_act_scalar(Activation act, const float* gate, const float* up, int64_t n, float* out) {
    if (act == Activation::SiLU) {
        for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    } else if (act == Activation::SwiGLUClamped) {
        for (int64_t i = 0; i < n; ++i) {
            const float g = std::min(gate[i], kSwiGLULimit);
            const float u = std::max(std::min(up[i], kSwiGLULimit), -kSwiGLULimit) + 1.0f;
            out[i] = g / (1.0f + std::exp(-kSwiGLUAlpha * g)) * u;
        }
    } else {
        // 0.5 g (1 + tanh(y)) written as g / (1 + exp(-2y)), y = sqrt(2 / pi) (g + 0.044715 g^3):
        // one expf, as the CUDA kernel computes it.
        for (int64_t i = 0; i < n; ++i) {
            const float g = gate[i], cube = 0.044715f * g * g * g;
            out[i] = g / (1.0f + std::exp(-1.5957691216057308f * (g + cube))) * up[i];
        }
    }
}

void CpuBackend::gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out) {
    const GatedActFn kernel = gated_act_kernel(simd_);
    pool_.parallel_for(n, 1024, [&](int64_t b, int64_t e) { kernel(act, gate + b, up + b, e - b, out + b); });
}

void CpuBackend::add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void CpuBackend::add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim) {
    add_bias_rows(x, bias, n_tok, dim);
}

void CpuBackend::scale_softcap(float* x, int64_t n, float scale, float cap) {
    pool_.parallel_for(n, 4096, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) x[i] *= scale;
        if (cap > 0.0f)
            for (int64_t i = b; i < e; ++i) x[i] = cap * std::tanh(x[i] / cap);
    });
}

void CpuBackend::argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids) {
    pool_.parallel_for(n_rows, 1, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) ids[r] = greedy_token(x + r * width, (int32_t)width);
    });
}

HostParallelFor CpuBackend::host_parallel_for() {
    return [this](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
        pool_.parallel_for(n, grain, fn);
    };
}

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opts) {
    if (opts.n_threads <= 0) fail("cpu backend: n_threads must be positive, got ", opts.n_threads);
    // Workers past the hardware threads only wait on each other at the pool's barriers while
    // preempted (1000 threads on 2 cores: minutes per token). Capped here, the factory every
    // front end's context goes through, so Llama, the tools and the C++ API all get it.
    int n_threads = opts.n_threads;
    const unsigned hw = std::thread::hardware_concurrency();
    if (hw > 0 && (unsigned)n_threads > hw) {
        std::fprintf(stderr, "ember: warning: n_threads %d is more than the %u hardware threads; using %u\n", n_threads,
                     hw, hw);
        n_threads = (int)hw;
    }
    return std::make_unique<CpuBackend>(n_threads, opts.switches);
}

}  // namespace ember
