// Per-token and per-row pieces of the CPU's mixture-of-experts ops, shared by its primitives and its
// grouped moe so that both compute each value the same way.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace ember {

// One token's routing (Backend::moe_route): ids and weights [w.n_used] from logits [w.n_expert].
void moe_route_token(const MoeWeights& w, const float* logits, int32_t* ids, float* weights);
// x[t][j] += bias[j] for n_tok rows of dim (CpuBackend::add_bias)
void add_bias_rows(float* x, const float* bias, int64_t n_tok, int64_t dim);
// out[j] += scale * y[j]
void scatter_add_row(float* out, const float* y, float scale, int64_t dim);

}  // namespace ember
