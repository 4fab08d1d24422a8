// Quantized matmul on the CPU: activations are quantized once to the weight type's vec_dot
// format, then each thread takes chunks of weight rows. A batch goes through the tiled kernel
// that matches vec_dot bit for bit where there is one (cpu/gemm.h); otherwise, and for a
// single token, every token is dotted against each row (a row stays in cache meanwhile).
#include <algorithm>

#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "quant/activation.h"

namespace ember {

void CpuBackend::matmul(const Weight& w, const float* x, int32_t n_tok, float* y) {
    const TypeTraits& tr = type_traits(w.type);
    const size_t x_row = row_bytes(tr.vec_dot_type, w.n_in);
    const size_t w_row = row_bytes(w.type, w.n_in);
    if (act_q_.size() < x_row * n_tok) act_q_.resize(x_row * n_tok);
    uint8_t* xq = act_q_.data();
    pool_.parallel_for(n_tok, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t)
            quantize_activations(tr.vec_dot_type, x + t * w.n_in, xq + t * x_row, w.n_in);
    });
    const auto* wdata = static_cast<const uint8_t*>(w.data);
    const VecDotFn dot = tr.vec_dot;
    const int64_t n_out = w.n_out, n_in = w.n_in;
    // Few chunks per matmul: each hand-out costs a cache-line round trip between cores, which at
    // 16-row chunks cost a third of decode time on 2 threads. Eight (up to 4 threads) still
    // rebalance when one thread is late; more threads get two each so that all of them work.
    // Each output row is still one dot (or gemm) call: the chunking never changes a result.
    const int64_t n_chunks = std::max<int64_t>(8, 2 * (int64_t)pool_.size());
    if (n_tok > 1) {
        if (const GemmFn gemm = gemm_avx512_for(dot)) {
            // Chunks of whole 16-row tiles: the kernel prepares each token tile's scales once per
            // chunk, so fewer, larger chunks waste less.
            const int64_t grain = std::max<int64_t>(16, (n_out / n_chunks + 15) / 16 * 16);
            pool_.parallel_for(n_out, grain, [&](int64_t b, int64_t e) {
                gemm(n_in, wdata, w_row, xq, x_row, n_tok, b, e, y, n_out);
            });
            return;
        }
    }
    pool_.parallel_for(n_out, std::max<int64_t>(16, n_out / n_chunks), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
            const uint8_t* wr = wdata + o * w_row;
            for (int32_t t = 0; t < n_tok; ++t) y[(int64_t)t * n_out + o] = dot(n_in, wr, xq + t * x_row);
        }
    });
}

}  // namespace ember
