// Backend::ssm_scan's head loop (ssm_scan_heads.h) built with AVX2 and FMA: a state row's eight
// partial sums are one vector, and its update and dot product fuse.
#include "cpu/ssm_scan_heads.h"

namespace ember {

void ssm_scan_heads_avx2(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                         int32_t n_tok, const SsmShape& s, int64_t h0, int64_t h1, float* state, float* y) {
    scan_heads(xbc, dt, A, dt_bias, D, n_tok, s, h0, h1, state, y);
}

}  // namespace ember
