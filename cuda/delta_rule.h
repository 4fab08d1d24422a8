// Launcher of the gated delta rule's kernel (delta_rule.cu), Backend::gated_delta_rule on the GPU.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/delta_rule.h"

namespace ember {
namespace cuda {

// Heads of q and k up to this width: a CTA keeps head_k rows of its state columns in shared memory.
constexpr int kDeltaRuleMaxHeadK = 256;

// As Backend::gated_delta_rule: state [n_v_heads][head_k][head_v] updated in place, all in device memory.
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int32_t n_tok,
                      const DeltaRuleShape& shape, float* state, float* out, cudaStream_t s);

}  // namespace cuda
}  // namespace ember
