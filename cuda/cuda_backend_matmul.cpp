// The CUDA backend's matmul dispatch: each weight's kernel comes from choose_matmul
// (kernel_choice.h); here the weights of one call are grouped into launches, the activations are
// made in the form the kernels read (q8_1 blocks, gemm_dq's f16 order), and cuBLAS is called.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_backend_impl.h"
#include "cuda_check.h"

namespace ember {
namespace cuda {

MatmulQuery CudaBackend::matmul_query(const Weight& w, int32_t n_tok) const {
    MatmulQuery q;
    q.type = w.type;
    q.n_in = w.n_in;
    q.batch = batch_facts(n_tok);
    q.sw = sw_;
    q.dev = dev_;
    return q;
}

void CudaBackend::matmul(const Weight& w, const float* x, int32_t n_tok, float* y) {
    issue_uploads();
    const Weight* ws[1] = {&w};
    project(ws, &y, 1, x, n_tok, false);
}

// One q8_1 quantization of x for all weights, and one GEMV launch per run of weights of one type.
void CudaBackend::matmul_many(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok) {
    if (!sw_.fuse) return Backend::matmul_many(ws, ys, count, x, n_tok);
    issue_uploads();
    project(ws, ys, count, x, n_tok, false);
}

// Whether the input of a projection by these weights should come with its q8_1 blocks.
bool CudaBackend::feeds_q8(const Weight* const* ws, int count, int32_t n_tok, int64_t width) const {
    bool any = false;
    for (int i = 0; i < count; ++i) any |= gemv_wants_q8(ws[i]->type);
    return input_wants_q8(n_tok, width, any);
}

// Fills r with ws[i], ws[i + 1], ... of ws[i]'s type while `takes` holds, up to `limit`; advances
// i past them.
template <class Takes>
void CudaBackend::take_run(WeightRun& r, const Weight* const* ws, float* const* ys, int& i, int count, int limit,
                           Takes takes) const {
    const GGMLType type = ws[i]->type;
    for (r.n = 0; i < count && r.n < limit && ws[i]->type == type && takes(*ws[i]); ++i, ++r.n) {
        r.dw[r.n] = device_weight(*ws[i]);
        r.pw[r.n] = &r.dw[r.n];
        r.py[r.n] = ys[i];
    }
}

// y = rmsnorm(x += residual) * gamma; with q8, y also as q8_1 blocks in the scratch; with dq, also
// as gemm_dq's f16 input in xh_.
void CudaBackend::norm(float* x, const float* residual, const float* gamma, int32_t n_tok, int32_t dim, float eps,
                       float* y, bool q8, bool dq) {
    const Q8 q = q8 ? q8_scratch(int64_t(n_tok) * dim) : Q8{};
    cuda::rmsnorm(x, residual, gamma, n_tok, dim, eps, y, q.q, q.ds, stream_,
                  dq ? dq_scratch(int64_t(n_tok) * dim) : nullptr);
}

// ys[i] = x ws[i]^T, each weight by the kernel choose_matmul names. x_q8: the scratch already holds
// x as q8_1 blocks (the kernel before wrote them), else they are made here where a kernel reads
// them; x_dq: xh_ already holds x as gemm_dq's f16 input (ws[0] takes gemm_dq). Where no weight
// takes gemm_dq, batches of up to kMaxGemvTokens go as one GEMV launch per run of up to
// kMaxGemvBatch consecutive weights of one type; gemm_dq takes a run of up to kMaxGemmDqWeights
// consecutive weights of one format in one launch (x converted to f16 once for all of them).
void CudaBackend::project(const Weight* const* ws, float* const* ys, int count, const float* x, int32_t n_tok,
                          bool x_q8, bool x_dq) {
    if (n_tok <= 0 || count <= 0) return;
    const int64_t n_in = ws[0]->n_in;
    for (int i = 1; i < count; ++i)
        if (ws[i]->n_in != n_in) fail("cuda matmul: weights of one input read ", n_in, " and ", ws[i]->n_in, " values");
    bool any_dq = false, reads_q8 = false;
    for (int i = 0; i < count; ++i) {
        const MatmulQuery q = matmul_query(*ws[i], n_tok);
        any_dq |= is_gemm_dq(choose_matmul(q));
        reads_q8 |= matmul_reads_q8(q);
    }
    if (!x_q8 && reads_q8 && n_in % 32 == 0) {
        const Q8 q = q8_scratch(int64_t(n_tok) * n_in);
        quantize_q8_1(x, q.q, q.ds, n_tok, n_in, stream_);
    }
    const auto* xq = static_cast<const int8_t*>(xq_.p);
    const auto* xds = static_cast<const float2*>(xds_.p);
    if (n_tok <= kMaxGemvTokens && (!any_dq || invariant_)) {
        for (int i = 0; i < count;) {
            WeightRun r;
            take_run(r, ws, ys, i, count, kMaxGemvBatch, [](const Weight&) { return true; });
            gemv(r.pw, r.py, r.n, x, xq, xds, n_tok, stream_);
        }
        return;
    }
    auto gemv_chunks = [&](const Weight& w, float* y) {
        const DeviceWeight dw = device_weight(w);
        const DeviceWeight* pw[1] = {&dw};
        for (int32_t t0 = 0; t0 < n_tok; t0 += kMaxGemvTokens) {
            float* py[1] = {y + int64_t(t0) * w.n_out};
            gemv(pw, py, 1, x + int64_t(t0) * n_in, xq + int64_t(t0) * n_in, xds + int64_t(t0) * (n_in / 32),
                 std::min<int32_t>(kMaxGemvTokens, n_tok - t0), stream_);
        }
    };
    bool xh_dq = x_dq;   // xh_ holds x in gemm_dq's order
    for (int i = 0; i < count;) {
        const Weight& w = *ws[i];
        const MatmulKernel k = choose_matmul(matmul_query(w, n_tok));
        if (is_gemv(k)) {
            gemv_chunks(w, ys[i++]);
        } else if (is_gemm_dq(k)) {
            if (!xh_dq) {
                ensure(xh_, size_t(n_tok) * size_t(n_in) * 2);
                gemm_dq_input(x, static_cast<__half*>(xh_.p), n_tok, n_in, stream_);
                xh_dq = true;
            }
            WeightRun r;
            take_run(r, ws, ys, i, count, kMaxGemmDqWeights, [&](const Weight& v) { return takes_gemm_dq(v, n_tok); });
            const GemmDqForm form{k == MatmulKernel::gemm_dq_wgmma, gemm_dq_rows_};
            gemm_dq(r.pw, r.py, r.n, static_cast<const __half*>(xh_.p), n_tok, form, stream_);
        } else if (k == MatmulKernel::gemm_q8) {
            gemm_q8(device_weight(w), ys[i++], xq, xds, n_tok, stream_);
        } else {
            gemm(w, x, n_tok, ys[i++]);
            xh_dq = false;   // gemm() converts x into xh_ in the natural order
        }
    }
}

// Prompt batches: tensor cores through cuBLAS, y^T [n_out x n_tok] = W [n_out x n_in] x^T
// (column-major: A = W^T with lda n_in, B = x^T with ldb n_in, C ldc n_out).
void CudaBackend::gemm(const Weight& w, const float* x, int32_t n_tok, float* y) {
    const float one = 1.f, zero = 0.f;
    const void* A = w.data;
    const void* B = x;
    cudaDataType ta = CUDA_R_32F, tb = CUDA_R_32F;
    const size_t nx = size_t(n_tok) * size_t(w.n_in);
    if (w.type == GGMLType::F32) {
        // float weights stay float (no tensor-core rounding of small F32 tensors)
    } else if (w.type == GGMLType::BF16) {
        ensure(xh_, nx * 2);
        convert_to_bf16(x, static_cast<__nv_bfloat16*>(xh_.p), int64_t(nx), stream_);
        ta = tb = CUDA_R_16BF;
        B = xh_.p;
    } else {
        ensure(xh_, nx * 2);
        convert_to_f16(x, static_cast<__half*>(xh_.p), int64_t(nx), stream_);
        ta = tb = CUDA_R_16F;
        B = xh_.p;
        if (w.type != GGMLType::F16) {
            ensure(wh_, size_t(w.n_out) * size_t(w.n_in) * 2);
            dequantize_f16(device_weight(w), static_cast<__half*>(wh_.p), stream_);
            A = wh_.p;
        }
    }
    EMBER_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(w.n_out), n_tok, int(w.n_in), &one, A, ta,
                                    int(w.n_in), B, tb, int(w.n_in), &zero, y, CUDA_R_32F, int(w.n_out),
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace cuda
}  // namespace ember
