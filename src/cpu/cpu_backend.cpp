// CPU backend memory, weight binding and the elementwise ops (norm, rope, swiglu, add).
#include "cpu/cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ember/status.h"
#include "backend/rope_angles.h"

namespace ember {

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads) {
    if (const char* kb = std::getenv("EMBER_CPU_HANDOUT_KB")) handout_bytes_ = size_t(std::atol(kb)) << 10;
}

void* CpuBackend::alloc(size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw OutOfMemory(cat("cannot allocate ", bytes / (1 << 20), " MiB of host memory"));
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
    return w;
}

const float* CpuBackend::prepare_vector(const GGUFTensor& t) {
    if (t.type == GGMLType::F32) return reinterpret_cast<const float*>(t.data);
    const TypeTraits& tr = type_traits(t.type);
    f32_vectors_.emplace_back(t.n_elements());
    tr.dequantize_row(t.data, f32_vectors_.back().data(), t.n_elements());
    return f32_vectors_.back().data();
}

void CpuBackend::rmsnorm(const float* x, const float* gamma, int32_t n_tok, int32_t dim, float eps,
                         float* y) {
    for (int32_t t = 0; t < n_tok; ++t) {
        const float* xr = x + (int64_t)t * dim;
        float* yr = y + (int64_t)t * dim;
        double ss = 0.0;
        for (int32_t i = 0; i < dim; ++i) ss += (double)xr[i] * xr[i];
        const float scale = 1.0f / std::sqrt((float)(ss / dim) + eps);
        for (int32_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * gamma[i];
    }
}

void CpuBackend::rope(float* x, int32_t n_tok, int32_t n_heads, int32_t head_dim, float freq_base,
                      bool neox) {
    // llama layout rotates adjacent pairs (2i, 2i+1); neox rotates (i, i + head_dim/2).
    const int32_t half = head_dim / 2;
    std::vector<float> cos_t(half), sin_t(half);
    for (int32_t t = 0; t < n_tok; ++t) {
        for (int32_t i = 0; i < half; ++i) rope_cos_sin(batch_.pos[t], i, head_dim, freq_base, cos_t[i], sin_t[i]);
        for (int32_t h = 0; h < n_heads; ++h) {
            float* v = x + ((int64_t)t * n_heads + h) * head_dim;
            for (int32_t i = 0; i < half; ++i) {
                const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                const float x0 = v[a], x1 = v[b];
                v[a] = x0 * cos_t[i] - x1 * sin_t[i];
                v[b] = x0 * sin_t[i] + x1 * cos_t[i];
            }
        }
    }
}

void CpuBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
    pool_.parallel_for(n, 1024, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    });
}

void CpuBackend::add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void CpuBackend::add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim) {
    for (int32_t t = 0; t < n_tok; ++t)
        for (int32_t j = 0; j < dim; ++j) x[(int64_t)t * dim + j] += bias[j];
}

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
    return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace ember
