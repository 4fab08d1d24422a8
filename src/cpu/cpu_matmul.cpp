// Quantized matmul on the CPU. Where the fast kernels (cpu/gemm_fast.h) of the weight type have a
// single-token form, every batch takes them, one token included (fast_always below): a token's
// result is then the same whatever shares its step and however its prompt was split. Otherwise
// activations are quantized once to the weight type's vec_dot format, then each thread takes
// chunks of weight rows: a batch goes through the tiled kernel that matches vec_dot bit for bit
// where there is one (cpu/gemm.h); otherwise, and for a single token, every token is dotted
// against each row (a row stays in cache meanwhile), and batches of several sequences may take
// the fast kernels, which are not bit-identical to vec_dot (fast_batch below). Each output row is
// one kernel call however the rows are chunked or merged, so neither ever changes a result.
#include <algorithm>
#include <cmath>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_matmul.h"

namespace ember {
namespace {

// Whether a batch of n_tok tokens of a type without a single-token fast kernel may use the fast
// kernels, whose sums differ from vec_dot's in the last bits (and, once the next matmul
// requantizes its input to int8, by a quantization step here and there: greedy outputs drift
// from one-at-a-time ones). One sequence keeps the exact tiles, since a token's result must not
// depend on how its prompt was split into batches, and so does the engine's deterministic mode
// (batch_invariant), where it must not depend on what else shares its step, a single token
// (vec_dot) included.
bool fast_batch(const BatchInfo& batch, int32_t n_tok) {
    return n_tok >= 2 && batch.n_seq > 1 && !batch.batch_invariant;
}

// The fast kernel every batch of this weight type takes, one token included, or nullptr: where
// the fast kernels have a single-token form, every token's result is the fast arithmetic's
// whatever the batch (one sequence or several, deterministic or not, any prompt split).
const FastGemm* fast_always(GGMLType type, SimdLevel level) {
    const FastGemm* k = fast_gemm_for(type, level);
    return k && k->gemv ? k : nullptr;
}

// Rows per hand-out of the fast kernel: whole row tiles, as few chunks as n_chunks allows (each
// chunk transposes its rows' blocks once and quantizes nothing).
int64_t fast_grain(int64_t n_out, int64_t n_chunks, int64_t tile) {
    return std::max<int64_t>(tile, (n_out / n_chunks + tile - 1) / tile * tile);
}

// x quantized for the fast kernel k into buf (whole token tiles shared out among the threads: the
// tokens of a tile share cache lines).
const uint8_t* prepare_fast(ThreadPool& pool, std::vector<uint8_t>& buf, const FastGemm& k, const float* x,
                            int64_t n_in, int32_t n_tok, SimdLevel level) {
    const size_t bytes = fast_gemm_act_bytes(n_in, n_tok);
    if (buf.size() < bytes) buf.resize(bytes);
    uint8_t* act = buf.data();
    const int64_t nb = n_in / 32;
    if (n_tok > kFastTok) {
        pool.parallel_for(n_tok, kFastTok, [&](int64_t b, int64_t e) {
            fast_gemm_prepare(k, x, n_in, int32_t(b), int32_t(e), 0, nb, act, level);
        });
        return act;
    }
    // One tile (a decode batch): the threads take runs of blocks of every token (whole Q8_K
    // super-blocks): quantizing a decode batch costs several hand-outs' worth of time, so one thread
    // doing it alone would hold the others up.
    const int64_t unit = k.act_type == GGMLType::Q8_K ? 8 : 1, n_units = (nb + unit - 1) / unit;
    pool.parallel_for(n_units, (n_units + pool.size() - 1) / pool.size(), [&](int64_t b, int64_t e) {
        fast_gemm_prepare(k, x, n_in, 0, n_tok, b * unit, std::min(nb, e * unit), act, level);
    });
    return act;
}

// One token's x prepared for kernel k's gemv into buf.
const uint8_t* prepare_one(std::vector<uint8_t>& buf, const FastGemm& k, const float* x, int64_t n_in,
                           SimdLevel level) {
    const size_t bytes = fast_gemv_act_bytes(n_in);
    if (buf.size() < bytes) buf.resize(bytes);
    fast_gemv_prepare(k, x, n_in, buf.data(), level);
    return buf.data();
}

// A batch through several weights of one input with the fast kernels: the input is prepared once
// and the row tiles of all of them are handed out as one job. False (nothing done) unless every
// weight has a fast kernel reading the same prepared activations (for one token: single-token
// kernels, which the caller checked).
bool matmul_many_fast(ThreadPool& pool, std::vector<uint8_t>& buf, int64_t n_chunks, const Weight* const* ws,
                      float* const* ys, int count, const float* x, int32_t n_tok, SimdLevel level) {
    std::vector<const FastGemm*> ks(count);
    for (int i = 0; i < count; ++i) {
        ks[i] = fast_gemm_for(ws[i]->type, level);
        if (!ks[i] || ks[i]->act_type != ks[0]->act_type || ks[i]->offset != ks[0]->offset ||
            ks[i]->row_tile != ks[0]->row_tile || ws[i]->n_in != ws[0]->n_in)
            return false;
    }
    const int64_t n_in = ws[0]->n_in, tile = ks[0]->row_tile;
    const uint8_t* act = n_tok == 1 ? prepare_one(buf, *ks[0], x, n_in, level)
                                    : prepare_fast(pool, buf, *ks[0], x, n_in, n_tok, level);
    std::vector<int64_t> first(count + 1, 0);   // row tiles of weight i: [first[i], first[i + 1])
    for (int i = 0; i < count; ++i) first[i + 1] = first[i] + (ws[i]->n_out + tile - 1) / tile;
    const int64_t total = first[count];
    pool.parallel_for(total, fast_grain(total * tile, n_chunks, tile) / tile, [&](int64_t b, int64_t e) {
        int i = 0;
        while (first[i + 1] <= b) ++i;
        for (int64_t g = b; g < e; ++i) {
            const Weight& w = *ws[i];
            const int64_t stop = std::min(e, first[i + 1]);
            const int64_t o_begin = (g - first[i]) * tile, o_end = std::min(w.n_out, (stop - first[i]) * tile);
            if (n_tok == 1)
                ks[i]->gemv(n_in, static_cast<const uint8_t*>(w.data), row_bytes(w.type, n_in), act, o_begin, o_end,
                            ys[i]);
            else
                ks[i]->gemm(n_in, static_cast<const uint8_t*>(w.data), row_bytes(w.type, n_in), act, n_tok, o_begin,
                            o_end, ys[i], w.n_out);
            g = stop;
        }
    });
    return true;
}

}  // namespace

const uint8_t* CpuBackend::quantize_input(GGMLType type, const float* x, int64_t n_in, int32_t n_tok) {
    const size_t x_row = row_bytes(type, n_in);
    if (act_q_.size() < x_row * n_tok) act_q_.resize(x_row * n_tok);
    uint8_t* xq = act_q_.data();
    pool_.parallel_for(n_tok, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) quantize_activations(type, x + t * n_in, xq + t * x_row, n_in, simd_);
    });
    return xq;
}

MatmulPath CpuBackend::matmul_path(GGMLType type, int32_t n_tok) const {
    const bool always = fast_always(type, fast_level_) != nullptr;
    if (always && n_tok == 1) return MatmulPath::fast_gemv;
    if ((fast_batch(batch_, n_tok) || always) && fast_gemm_for(type, fast_level_)) return MatmulPath::fast_gemm;
    if (n_tok > 1 && gemm_for(cpu_kernels(type, simd_).vec_dot)) return MatmulPath::tiled;
    return MatmulPath::dots;
}

MatmulRows CpuBackend::matmul_kernel(MatmulPath path, const Weight& w, int32_t n_tok, float* y) const {
    MatmulRows m;
    m.path = path;
    m.w = &w;
    m.n_tok = n_tok;
    m.y = y;
    if (path == MatmulPath::fast_gemv || path == MatmulPath::fast_gemm) {
        m.fast = fast_gemm_for(w.type, fast_level_);
        return m;
    }
    const CpuKernels& kern = cpu_kernels(w.type, simd_);
    m.dot = kern.vec_dot;
    m.act_type = kern.vec_dot_type;
    m.x_row = row_bytes(kern.vec_dot_type, w.n_in);
    if (path == MatmulPath::tiled) m.gemm = gemm_for(kern.vec_dot);
    return m;
}

size_t CpuBackend::matmul_input_bytes(const MatmulRows& m) const {
    if (m.path == MatmulPath::fast_gemv) return fast_gemv_act_bytes(m.w->n_in);
    if (m.path == MatmulPath::fast_gemm) return fast_gemm_act_bytes(m.w->n_in, m.n_tok);
    return m.x_row * m.n_tok;
}

void CpuBackend::prepare_matmul_input(MatmulRows& m, const float* x, uint8_t* buf) const {
    const int64_t n_in = m.w->n_in;
    if (m.path == MatmulPath::fast_gemv) {
        fast_gemv_prepare(*m.fast, x, n_in, buf, simd_);
    } else if (m.path == MatmulPath::fast_gemm) {
        fast_gemm_prepare(*m.fast, x, n_in, 0, m.n_tok, 0, n_in / 32, buf, simd_);
    } else {
        for (int32_t t = 0; t < m.n_tok; ++t)
            quantize_activations(m.act_type, x + t * n_in, buf + t * m.x_row, n_in, simd_);
    }
    m.act = buf;
}

void MatmulRows::rows(int64_t b, int64_t e) const {
    const auto* wdata = static_cast<const uint8_t*>(w->data);
    const int64_t n_in = w->n_in, n_out = w->n_out;
    const size_t w_row = row_bytes(w->type, n_in);
    switch (path) {
        case MatmulPath::fast_gemv: fast->gemv(n_in, wdata, w_row, act, b, e, y); break;
        case MatmulPath::fast_gemm: fast->gemm(n_in, wdata, w_row, act, n_tok, b, e, y, n_out); break;
        case MatmulPath::tiled: gemm(n_in, wdata, w_row, act, x_row, n_tok, b, e, y, n_out); break;
        case MatmulPath::dots:
            for (int64_t o = b; o < e; ++o) {
                const uint8_t* wr = wdata + o * w_row;
                for (int32_t t = 0; t < n_tok; ++t) y[(int64_t)t * n_out + o] = dot(n_in, wr, act + t * x_row);
            }
            break;
    }
}

void CpuBackend::matmul(const Weight& w, const float* x, int32_t n_tok, float* y) {
    MatmulRows m = matmul_kernel(matmul_path(w.type, n_tok), w, n_tok, y);
    const size_t w_row = row_bytes(w.type, w.n_in);
    const int64_t n_out = w.n_out, tile = m.tile();
    int64_t grain = 0;
    switch (m.path) {
        case MatmulPath::fast_gemv:
            m.act = prepare_one(act_q_, *m.fast, x, w.n_in, simd_);
            grain = (row_grain(n_out, w_row) + tile - 1) / tile * tile;
            break;
        case MatmulPath::fast_gemm:
            m.act = prepare_fast(pool_, act_q_, *m.fast, x, w.n_in, n_tok, simd_);
            grain = fast_grain(n_out, n_chunks(), tile);
            break;
        case MatmulPath::tiled:
            // Chunks of whole 16-row tiles: the kernel prepares each token tile's scales once per
            // chunk, so fewer, larger chunks waste less.
            m.act = quantize_input(m.act_type, x, w.n_in, n_tok);
            grain = std::max<int64_t>(16, (n_out / n_chunks() + 15) / 16 * 16);
            break;
        case MatmulPath::dots:
            m.act = quantize_input(m.act_type, x, w.n_in, n_tok);
            grain = row_grain(n_out, w_row);
            break;
    }
    pool_.parallel_for(n_out, grain, [&](int64_t b, int64_t e) { m.rows(b, e); });
}

int64_t CpuBackend::row_grain(int64_t n_rows, size_t w_row) const {
    double chunks = (double)n_chunks();
    if (handout_bytes_ > 0)
        chunks = std::max(chunks, pool_.size() * std::sqrt((double)n_rows * w_row / handout_bytes_));
    return std::max<int64_t>(16, (int64_t)(n_rows / chunks));
}

// Several weights of one input (Q, K, V; gate, up): the input is prepared once and the rows of all
// of them are handed out as one job, so the threads meet once instead of per weight (fast kernels:
// batches that take them for every weight; vec_dot: one token).
void CpuBackend::matmul_many(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok) {
    bool always = true;
    for (int i = 0; i < count; ++i) always = always && fast_always(ws[i]->type, fast_level_);
    if ((fast_batch(batch_, n_tok) || always) &&
        matmul_many_fast(pool_, act_q_, n_chunks(), ws, ys, count, x, n_tok, fast_level_))
        return;
    const GGMLType act = cpu_kernels(ws[0]->type, simd_).vec_dot_type;
    bool shared = n_tok == 1 && count > 1;
    for (int i = 0; i < count; ++i)   // (a type with a single-token fast kernel takes it, alone)
        shared = shared && !fast_always(ws[i]->type, fast_level_) &&
                 cpu_kernels(ws[i]->type, simd_).vec_dot_type == act && ws[i]->n_in == ws[0]->n_in;
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
            const VecDotFn dot = cpu_kernels(w.type, simd_).vec_dot;
            const size_t w_row = row_bytes(w.type, n_in);
            const auto* wdata = static_cast<const uint8_t*>(w.data);
            const int64_t stop = std::min(e, first[i + 1]);
            for (; g < stop; ++g) ys[i][g - first[i]] = dot(n_in, wdata + (g - first[i]) * w_row, xq);
        }
    });
}

}  // namespace ember
