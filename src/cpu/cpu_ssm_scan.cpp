// The CPU's Mamba2 selective scan (Backend::ssm_scan): the exact token-by-token recurrence of each
// head's state (ssm_scan_heads.h), the heads spread over the thread pool. Prompts take the same
// recurrence: with a head's state in cache it runs at the core's load and store rate, which the
// chunked (SSD) form's matrix products, with more arithmetic, do not beat on a CPU.
#include "cpu/cpu_backend.h"
#include "cpu/ssm_scan_heads.h"

namespace ember {

void CpuBackend::ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                          int32_t n_tok, const SsmShape& shape, float* state, float* y) {
    check_ssm_shape(shape, n_tok, "cpu ssm_scan");
    auto* heads = &scan_heads;
#if defined(__x86_64__) || defined(__i386__)
    if (simd_ == SimdLevel::avx2 || simd_ == SimdLevel::avx512) heads = &ssm_scan_heads_avx2;
#endif
    pool_.parallel_for(shape.n_head, 1,
                       [&](int64_t b, int64_t e) { heads(xbc, dt, A, dt_bias, D, n_tok, shape, b, e, state, y); });
}

}  // namespace ember
