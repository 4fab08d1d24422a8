// AVX2 + FMA + F16C dot products (the fallback below AVX-512): one 32-block per 256-bit
// vector, vpmaddubsw (u8 x s8 -> s16 pairs) then vpmaddwd against ones or per-group scales.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu/isa_kernels.h"
#include "cpu/simd_avx2.h"
#include "quant/decode.h"

namespace ember {
namespace {

using namespace avx2;

template <Legacy K>
float dot_legacy(int64_t n, const void* wv, const void* xv) {
    using WB = typename LegacyBlocks<K>::W;
    using XB = typename LegacyBlocks<K>::X;
    const WB* w = static_cast<const WB*>(wv);
    const XB* x = static_cast<const XB*>(xv);
    const int64_t nb = n / 32;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float summ = 0.0f;
    auto one = [&](int64_t i, __m256& acc) {
        const __m256i p = block_dot<K>(weight_bytes<K>(w[i]), x[i].qs);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), acc);
        if constexpr (kHasMin<K>) summ = std::fma(h2f(w[i].m), h2f(x[i].s), summ);   // gemm_avx2.cpp: the same
    };
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        one(i, acc0);
        one(i + 1, acc1);
    }
    if (i < nb) one(i, acc0);
    return hsum_ps(_mm256_add_ps(acc0, acc1)) + summ;
}

template <int Kind>   // 0: F32, 1: F16, 2: BF16
inline __m256 load_weights8(const void* w, int64_t i) {
    if constexpr (Kind == 0) return _mm256_loadu_ps(static_cast<const float*>(w) + i);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (Kind == 1) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int Kind>
inline float weight_at(const void* w, int64_t i) {
    if constexpr (Kind == 0) return static_cast<const float*>(w)[i];
    const uint16_t h = static_cast<const uint16_t*>(w)[i];
    if constexpr (Kind == 1) return h2f(h);
    else {
        const uint32_t u = uint32_t(h) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
}

template <int Kind>
float dot_float(int64_t n, const void* w, const void* xv) {
    const float* x = static_cast<const float*>(xv);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(load_weights8<Kind>(w, i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(load_weights8<Kind>(w, i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    }
    float s = hsum_ps(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) s += weight_at<Kind>(w, i) * x[i];
    return s;
}

template <bool Q5>
float dot_q45_k(int64_t n, const void* wv, const void* xv) {
    using WB = std::conditional_t<Q5, BlockQ5_K, BlockQ4_K>;
    const WB* w = static_cast<const WB*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const KScales sc(w[i].scales);
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
            const Q45Chunk<Q5> q(w[i], c);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q.lo, load256(x[i].qs + 64 * c)),
                                                            _mm256_set1_epi16(sc.sc[2 * c])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q.hi, load256(x[i].qs + 64 * c + 32)),
                                                            _mm256_set1_epi16(sc.sc[2 * c + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * x[i].d), acc);
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KScales::min_products(sc.mins16(), x[i])),
                               _mm256_set1_ps(h2f(w[i].dmin) * x[i].d), accm);
    }
    return hsum_ps(acc) - hsum_ps(accm);
}

float dot_q6_k(int64_t n, const void* wv, const void* xv) {
    const BlockQ6_K* w = static_cast<const BlockQ6_K*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i sumi = q6_offset_term(w[i], x[i]);
        for (int h = 0; h < 2; ++h) {
            const Q6Half q(w[i], h);
            for (int k = 0; k < 4; ++k) {
                const __m256i p = _mm256_maddubs_epi16(q.values(k), load256(x[i].qs + 128 * h + 32 * k));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, q6_scales(w[i], h, k)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return hsum_ps(acc);
}

// The table types: a block's nibbles looked up in the 16-entry table (both 128-bit lanes hold it).
inline __m256i table16(const int8_t* t) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
}
inline float table_scale(const BlockMXFP4& b) { return e8m0_half(b.e); }
// s16 pair sums of signed table values v (|v| <= 127) with activations x: |x| against v carrying
// x's sign, so that a Q8_K -128 (whose negation overflows) stays exact as the unsigned 128.
inline __m256i pairs_table(__m256i v, __m256i x) {
    return _mm256_maddubs_epi16(_mm256_abs_epi8(x), _mm256_sign_epi8(v, x));
}
inline float table_scale(const BlockIQ4_NL& b) { return h2f(b.d); }

// MXFP4 / IQ4_NL x Q8_0: the signed table values against the activations, one block a vector.
template <class WB>
float dot_table(int64_t n, const void* wv, const void* xv) {
    const WB* w = static_cast<const WB*>(wv);
    const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
    const __m256i table = table16(std::is_same<WB, BlockMXFP4>::value ? kvalues_mxfp4 : kvalues_iq4nl);
    const int64_t nb = n / 32;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    auto one = [&](int64_t i, __m256& acc) {
        const __m256i v = _mm256_shuffle_epi8(table, nibbles32(w[i].qs));
        const __m256i p = _mm256_madd_epi16(pairs_table(v, load256(x[i].qs)), _mm256_set1_epi16(1));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(table_scale(w[i]) * h2f(x[i].d)), acc);
    };
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        one(i, acc0);
        one(i + 1, acc1);
    }
    if (i < nb) one(i, acc0);
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// IQ4_XS x Q8_K: each sub-block's 16-bit pair sums times its scale (|pair| <= 2 * 127 * 128, |scale| <= 32).
float dot_iq4_xs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ4_XS* w = static_cast<const BlockIQ4_XS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const __m256i table = table16(kvalues_iq4nl);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const __m256i v = _mm256_shuffle_epi8(table, nibbles32(w[i].qs + 16 * j));
            const __m256i p = pairs_table(v, load256(x[i].qs + 32 * j));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(int16_t(iq4_xs_scale(w[i], j)))));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return hsum_ps(acc);
}

// The grid types x Q8_K: a sub-block's 8 grid words gathered by idx, negated where its 32 sign
// bits are set, then as IQ4_XS (sc16: the integer scale of each 16-bit pair lane, 0-7 the first
// 16 values, 8-15 the second).
inline __m256i grid_sub_block(const int* grid, __m256i idx, uint32_t signs, __m256i sc16, const int8_t* x) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                            3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ULL));
    const __m256i g = _mm256_i32gather_epi32(grid, idx, 4);
    const __m256i neg = _mm256_cmpeq_epi8(
        _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(int(signs)), spread), bit), bit);
    const __m256i v = _mm256_sub_epi8(_mm256_xor_si256(g, neg), neg);
    return _mm256_madd_epi16(pairs_table(v, load256(x)), sc16);
}
inline __m256i grid_sub_block(const int* grid, __m256i idx, uint32_t signs, int sc, const int8_t* x) {
    return grid_sub_block(grid, idx, signs, _mm256_set1_epi16(int16_t(sc)), x);
}

inline __m256i points8(const uint8_t* qs) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
}

// IQ3_S: point index a qs byte with bit 8 from qh; scale 1 + 2 s.
float dot_iq3_s(int64_t n, const void* wv, const void* xv) {
    const BlockIQ3_S* w = static_cast<const BlockIQ3_S*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq3s_grid.v);
    const __m256i bit_of_point = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w[i].qh[j]), bit_of_point),
                                                _mm256_set1_epi32(1));
            const __m256i idx = _mm256_or_si256(points8(w[i].qs + 8 * j), _mm256_slli_epi32(hi, 8));
            uint32_t signs;
            std::memcpy(&signs, w[i].signs + 4 * j, 4);
            const int sc = 1 + 2 * ((w[i].scales[j / 2] >> (4 * (j % 2))) & 0x0F);
            sumi = _mm256_add_epi32(sumi, grid_sub_block(grid, idx, signs, sc, x[i].qs + 32 * j));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return hsum_ps(acc);
}

// IQ3_XXS: point index a qs byte; signs and scale 2 s + 1 from the sub-block's word (decode.h).
float dot_iq3_xxs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ3_XXS* w = static_cast<const BlockIQ3_XXS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq3xxs_grid.v);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const uint32_t aux = iq3_xxs_aux(w[i], j);
            sumi = _mm256_add_epi32(sumi, grid_sub_block(grid, points8(w[i].qs + 8 * j), iq2_signs32(aux),
                                                         2 * int(aux >> 28) + 1, x[i].qs + 32 * j));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * 0.25f * x[i].d), acc);
    }
    return hsum_ps(acc);
}

// IQ2_XXS: point l / 2 of a sub-block (8 values: grid words 2 p, 2 p + 1) is byte l / 2 of its first
// word; signs and scale 2 s + 1 from its second as IQ3_XXS's, d / 8.
float dot_iq2_xxs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ2_XXS* w = static_cast<const BlockIQ2_XXS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq2xxs_grid.v);
    const __m128i twice = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i half = _mm256_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            uint32_t aux[2];
            std::memcpy(aux, w[i].qs + 8 * j, 8);
            const __m256i p = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(int(aux[0])), twice));
            const __m256i idx = _mm256_add_epi32(_mm256_slli_epi32(p, 1), half);
            sumi = _mm256_add_epi32(
                sumi, grid_sub_block(grid, idx, iq2_signs32(aux[1]), 2 * int(aux[1] >> 28) + 1, x[i].qs + 32 * j));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * 0.125f * x[i].d), acc);
    }
    return hsum_ps(acc);
}

// IQ2_XS: point l of a sub-block (8 values: grid words 2 p, 2 p + 1) is p = qs[l] & 511, its signs
// ksigns_iq2xs[qs[l] >> 9]; a scale 2 s + 1 per 16 values, d / 8.
float dot_iq2_xs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ2_XS* w = static_cast<const BlockIQ2_XS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq2xs_grid.v);
    const __m128i twice = _mm_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7);
    const __m256i half = _mm256_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const uint16_t* q = w[i].qs + 4 * j;
            const __m128i q4 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
            const __m256i p = _mm256_and_si256(_mm256_cvtepu16_epi32(_mm_shuffle_epi8(q4, twice)),
                                               _mm256_set1_epi32(511));
            const __m256i idx = _mm256_add_epi32(_mm256_slli_epi32(p, 1), half);
            uint32_t signs = 0;
            for (int l = 0; l < 4; ++l) signs |= uint32_t(ksigns_iq2xs[q[l] >> 9]) << (8 * l);
            const int s0 = 2 * (w[i].scales[j] & 0x0F) + 1, s1 = 2 * (w[i].scales[j] >> 4) + 1;
            const __m256i sc = _mm256_inserti128_si256(_mm256_set1_epi16(int16_t(s0)), _mm_set1_epi16(int16_t(s1)), 1);
            sumi = _mm256_add_epi32(sumi, grid_sub_block(grid, idx, signs, sc, x[i].qs + 32 * j));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * 0.125f * x[i].d), acc);
    }
    return hsum_ps(acc);
}

// IQ2_S: as IQ2_XS, point l's 10-bit index from qs and qh and its signs a byte.
float dot_iq2_s(int64_t n, const void* wv, const void* xv) {
    const BlockIQ2_S* w = static_cast<const BlockIQ2_S*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq2s_grid.v);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            int p[4];
            for (int l = 0; l < 4; ++l) p[l] = 2 * int(iq2_s_point(w[i], 4 * j + l));
            const __m256i idx = _mm256_setr_epi32(p[0], p[0] + 1, p[1], p[1] + 1, p[2], p[2] + 1, p[3], p[3] + 1);
            uint32_t signs;
            std::memcpy(&signs, w[i].signs + 4 * j, 4);
            const int s0 = 2 * (w[i].scales[j] & 0x0F) + 1, s1 = 2 * (w[i].scales[j] >> 4) + 1;
            const __m256i sc = _mm256_inserti128_si256(_mm256_set1_epi16(int16_t(s0)), _mm_set1_epi16(int16_t(s1)), 1);
            sumi = _mm256_add_epi32(sumi, grid_sub_block(grid, idx, signs, sc, x[i].qs + 32 * j));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(h2f(w[i].d) * 0.125f * x[i].d), acc);
    }
    return hsum_ps(acc);
}

}  // namespace

VecDotFn vec_dot_avx2(GGMLType type) {
    switch (type) {
        case GGMLType::F32: return dot_float<0>;
        case GGMLType::F16: return dot_float<1>;
        case GGMLType::BF16: return dot_float<2>;
        case GGMLType::Q4_0: return dot_legacy<Legacy::q4_0>;
        case GGMLType::Q4_1: return dot_legacy<Legacy::q4_1>;
        case GGMLType::Q5_0: return dot_legacy<Legacy::q5_0>;
        case GGMLType::Q5_1: return dot_legacy<Legacy::q5_1>;
        case GGMLType::Q8_0: return dot_legacy<Legacy::q8_0>;
        case GGMLType::Q2_K:
        case GGMLType::Q3_K: return vec_dot_q2_q3_avx2(type);
        case GGMLType::Q4_K: return dot_q45_k<false>;
        case GGMLType::Q5_K: return dot_q45_k<true>;
        case GGMLType::Q6_K: return dot_q6_k;
        case GGMLType::MXFP4: return dot_table<BlockMXFP4>;
        case GGMLType::IQ4_NL: return dot_table<BlockIQ4_NL>;
        case GGMLType::IQ4_XS: return dot_iq4_xs;
        case GGMLType::IQ3_S: return dot_iq3_s;
        case GGMLType::IQ3_XXS: return dot_iq3_xxs;
        case GGMLType::IQ2_XXS: return dot_iq2_xxs;
        case GGMLType::IQ2_XS: return dot_iq2_xs;
        case GGMLType::IQ2_S: return dot_iq2_s;
        default: return vec_dot_low_bit_avx2(type);
    }
}

}  // namespace ember
