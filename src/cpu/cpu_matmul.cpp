// Quantized matmul on the CPU: activations are quantized once to the weight type's vec_dot
// format, then each thread takes chunks of weight rows. A batch goes through the tiled kernel
// that matches vec_dot bit for bit where there is one (cpu/gemm.h); otherwise, and for a
// single token, every token is dotted against each row (a row stays in cache meanwhile).
// Each output row is one dot (or gemm) call however the rows are chunked or merged, so neither
// ever changes a result.
#include <algorithm>
#include <cmath>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_kernels.h"
#include "cpu/gemm.h"

namespace ember {

const uint8_t* CpuBackend::quantize_input(GGMLType type, const float* x, int64_t n_in, int32_t n_tok) {
    const size_t x_row = row_bytes(type, n_in);
    if (act_q_.size() < x_row * n_tok) act_q_.resize(x_row * n_tok);
    uint8_t* xq = act_q_.data();
    pool_.parallel_for(n_tok, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) quantize_activations(type, x + t * n_in, xq + t * x_row, n_in);
    });
    return xq;
}

void CpuBackend::matmul(const Weight& w, const float* x, int32_t n_tok, float* y) {
    const CpuKernels& kern = cpu_kernels(w.type);
    const size_t x_row = row_bytes(kern.vec_dot_type, w.n_in);
    const size_t w_row = row_bytes(w.type, w.n_in);
    const uint8_t* xq = quantize_input(kern.vec_dot_type, x, w.n_in, n_tok);
    const auto* wdata = static_cast<const uint8_t*>(w.data);
    const VecDotFn dot = kern.vec_dot;
    const int64_t n_out = w.n_out, n_in = w.n_in;
    if (n_tok > 1) {
        if (const GemmFn gemm = gemm_for(dot)) {
            // Chunks of whole 16-row tiles: the kernel prepares each token tile's scales once per
            // chunk, so fewer, larger chunks waste less.
            const int64_t grain = std::max<int64_t>(16, (n_out / n_chunks() + 15) / 16 * 16);
            pool_.parallel_for(n_out, grain, [&](int64_t b, int64_t e) {
                gemm(n_in, wdata, w_row, xq, x_row, n_tok, b, e, y, n_out);
            });
            return;
        }
    }
    pool_.parallel_for(n_out, row_grain(n_out, w_row), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
            const uint8_t* wr = wdata + o * w_row;
            for (int32_t t = 0; t < n_tok; ++t) y[(int64_t)t * n_out + o] = dot(n_in, wr, xq + t * x_row);
        }
    });
}

int64_t CpuBackend::row_grain(int64_t n_rows, size_t w_row) const {
    double chunks = (double)n_chunks();
    if (handout_bytes_ > 0)
        chunks = std::max(chunks, pool_.size() * std::sqrt((double)n_rows * w_row / handout_bytes_));
    return std::max<int64_t>(16, (int64_t)(n_rows / chunks));
}

// One token (decode) through several weights of one input: the input is quantized once and the
// rows of all of them are handed out as one job, so the threads meet once instead of per weight.
void CpuBackend::matmul_many(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok) {
    const GGMLType act = cpu_kernels(ws[0]->type).vec_dot_type;
    bool shared = n_tok == 1 && count > 1;
    for (int i = 1; i < count; ++i)
        shared = shared && cpu_kernels(ws[i]->type).vec_dot_type == act && ws[i]->n_in == ws[0]->n_in;
    if (!shared) {
        Backend::matmul_many(ws, ys, count, x, n_tok);
        return;
    }
    const int64_t n_in = ws[0]->n_in;
    const uint8_t* xq = quantize_input(act, x, n_in, 1);
    std::vector<int64_t> first(count + 1, 0);   // rows of weight i: [first[i], first[i + 1])
    for (int i = 0; i < count; ++i) first[i + 1] = first[i] + ws[i]->n_out;
    const int64_t total = first[count];
    pool_.parallel_for(total, row_grain(total, row_bytes(ws[0]->type, n_in)), [&](int64_t b, int64_t e) {
        int i = 0;
        while (first[i + 1] <= b) ++i;
        for (int64_t g = b; g < e; ++i) {
            const Weight& w = *ws[i];
            const VecDotFn dot = cpu_kernels(w.type).vec_dot;
            const size_t w_row = row_bytes(w.type, n_in);
            const auto* wdata = static_cast<const uint8_t*>(w.data);
            const int64_t stop = std::min(e, first[i + 1]);
            for (; g < stop; ++g) ys[i][g - first[i]] = dot(n_in, wdata + (g - first[i]) * w_row, xq);
        }
    });
}

}  // namespace ember
