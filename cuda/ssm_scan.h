// Launcher of Mamba2's selective scan kernel (ssm_scan.cu), Backend::ssm_scan on the GPU.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/ssm_scan.h"

namespace ember {
namespace cuda {

// States up to this wide: a lane keeps d_state / 32 columns of its warp's state row in registers.
constexpr int kSsmMaxDState = 256;

// As Backend::ssm_scan: state [n_head][head_dim][d_state] updated in place, all in device memory.
void ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D, int32_t n_tok,
              const SsmShape& shape, float* state, float* y, cudaStream_t s);

}  // namespace cuda
}  // namespace ember
