// Quantizers weighted by an importance per column (an importance matrix's mean squared activations,
// ember-quantize --imatrix): each element's rounding error counts in proportion, as llama-quantize's.
#pragma once
#include <cstdint>

#include "ember/quant.h"

namespace ember {

// qw: n importances, one per element of the row (the row's columns).
using QuantizeRowWeightedFn = void (*)(const float* src, void* dst, int64_t n, const float* qw);

// Q4_K, Q5_K, Q6_K as llama-quantize's (quant_k_weighted.cpp).
void quantize_q4_k_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_q5_k_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_q6_k_weighted(const float* src, void* dst, int64_t n, const float* qw);

// The low-bit types' (quant_q2_q3_k.cpp, quant_iq4_nl.cpp); IQ4_NL's is the weights' (search) quantizer.
void quantize_q2_k_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_q3_k_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_iq4_xs_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_iq4_nl_weighted(const float* src, void* dst, int64_t n, const float* qw);
// IQ3_XXS, IQ3_S (quant_iq3.cpp): qw may be null (the importances then x^2, as ggml's without a matrix).
void quantize_iq3_xxs_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_iq3_s_weighted(const float* src, void* dst, int64_t n, const float* qw);
// IQ2_XXS, IQ2_XS (quant_iq2.cpp): qw required.
void quantize_iq2_xxs_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_iq2_xs_weighted(const float* src, void* dst, int64_t n, const float* qw);
// IQ2_S: qw may be null.
void quantize_iq2_s_weighted(const float* src, void* dst, int64_t n, const float* qw);
// IQ1_S (quant_iq1.cpp): qw required. IQ1_M: qw may be null (the importances then x^2, as ggml's without a matrix).
void quantize_iq1_s_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_iq1_m_weighted(const float* src, void* dst, int64_t n, const float* qw);

// x ~= scale * L, L in [0, nmax], with weights w (ggml's make_qp_quants): grids nmax / max and (nmax + 0.1 k) / max
// for k in [-4, 4], the one of least w-weighted squared error, then up to 5 rounds moving single values to the
// level the rest's fit calls for. Returns the scale (Q2_K's super-block scales, IQ2_XXS's first guess).
float fit_levels_upward(int n, int nmax, const float* x, uint8_t* L, const float* w);

// ggml's make_qkx3_quants with weights: x ~= scale * L - min_out over n <= 32 values, L in [0, nmax], min_out >= 0,
// the least w-weighted squared error over the min/max grid and 37 grids (nmax - 0.9 + 0.05 k) / (max - min).
float fit_scale_min_weighted(int n, int nmax, const float* x, const float* w, uint8_t* L, float& min_out);
// ggml's make_qx_quants with weights: x ~= scale * (L - nmax), L - nmax in [-nmax, nmax - 1], levels from the value
// of largest magnitude at -nmax then 18 grids -(nmax + 0.1 k) / max, the best weighted least-squares fit.
float fit_symmetric_weighted(int n, int nmax, const float* x, int8_t* L, const float* w);
// Q4_0, Q4_1, Q5_0, Q5_1 with importances (quant_legacy_weighted.cpp), as llama-quantize's.
void quantize_q4_0_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_q4_1_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_q5_0_weighted(const float* src, void* dst, int64_t n, const float* qw);
void quantize_q5_1_weighted(const float* src, void* dst, int64_t n, const float* qw);

}  // namespace ember
