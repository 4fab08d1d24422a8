// AVX-512 (F, BW, VL, DQ, VNNI) dot products. Legacy 32-blocks go two per 512-bit vector
// (lanes 0-7 block i, 8-15 block i+1) through vpdpbusd (u8 x s8 -> s32); K-quants use
// vpmaddubsw (u8 x s8 -> s16 pairs) then vpdpwssd against per-sub-block scales.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "cpu/isa_kernels.h"
#include "cpu/legacy_blocks.h"
#include "quant/blocks.h"
#include "quant/decode.h"

namespace ember {
namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 nibble bytes -> 32 bytes: low nibbles (elements 0..15) then high nibbles (16..31).
inline __m256i nibbles32(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// Q5 weights: nibbles plus bit 4 of element j from bit j of qh.
inline __m256i q5_values(const uint8_t* qs, const uint8_t* qh) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    return _mm256_or_si256(nibbles32(qs), _mm256_maskz_mov_epi8(h, _mm256_set1_epi8(0x10)));
}

// ---- legacy 32-element blocks --------------------------------------------------------------
// Kind selects how the weight bytes are formed and which offset/min term applies.
template <Legacy K, class WB>
inline __m256i weight_values(const WB& b) {
    if constexpr (K == Legacy::q4_0 || K == Legacy::q4_1) return nibbles32(b.qs);
    else if constexpr (K == Legacy::q5_0 || K == Legacy::q5_1) return q5_values(b.qs, b.qh);
    else return load256(b.qs);
}

// Integer dot of 2 blocks (16 s32 lanes, 8 per block), offsets of the *_0 formats removed:
// sum (q - off) * x = sum q * x - off * sum x.
template <Legacy K>
inline __m512i dot_pair(__m512i w, __m512i x) {
    const __m512i zero = _mm512_setzero_si512();
    if constexpr (K == Legacy::q8_0) {
        // u8 x s8 product: |w| against x with w's sign moved onto x (x from our quantizer
        // is in [-127, 127], so negation never overflows).
        const __mmask64 neg = _mm512_movepi8_mask(w);
        const __m512i sx = _mm512_mask_sub_epi8(x, neg, zero, x);
        return _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(w), sx);
    } else {
        const __m512i p = _mm512_dpbusd_epi32(zero, w, x);
        if constexpr (K == Legacy::q4_0) return _mm512_sub_epi32(p, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(8), x));
        else if constexpr (K == Legacy::q5_0)
            return _mm512_sub_epi32(p, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(16), x));
        else return p;
    }
}

inline uint32_t load_u32(const void* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// The first 4 bytes of 4 blocks (d and m, or d and s; for the *_0 types d and 2 unused
// bytes) as 8 floats [d0, m0, d1, m1, d2, m2, d3, m3].
template <class B>
inline __m256 head_halves(const B* b) {
    const __m128i h = _mm_setr_epi32(int(load_u32(&b[0])), int(load_u32(&b[1])), int(load_u32(&b[2])),
                                     int(load_u32(&b[3])));
    return _mm256_cvtph_ps(h);
}

template <Legacy K>
float dot_legacy(int64_t n, const void* wv, const void* xv) {
    using WB = typename LegacyBlocks<K>::W;
    using XB = typename LegacyBlocks<K>::X;
    constexpr bool has_min = kHasMin<K>;
    const WB* w = static_cast<const WB*>(wv);
    const XB* x = static_cast<const XB*>(xv);
    const int64_t nb = n / 32;
    // lanes 0-7 take the scale of the pair's first block (float 0 or 4 of the 8 products),
    // lanes 8-15 the second's (float 2 or 6)
    const __m512i idx01 = _mm512_inserti64x4(_mm512_set1_epi32(0), _mm256_set1_epi32(2), 1);
    const __m512i idx23 = _mm512_inserti64x4(_mm512_set1_epi32(4), _mm256_set1_epi32(6), 1);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();   // odd lanes: m * s of each block
    int64_t i = 0;
    for (; i + 3 < nb; i += 4) {
        // 4 blocks: scales for all four at once, then two 512-bit pairs
        const __m256 prod = _mm256_mul_ps(head_halves(w + i), head_halves(x + i));
        if constexpr (has_min) accm = _mm256_add_ps(accm, prod);
        const __m512 p512 = _mm512_castps256_ps512(prod);
        const __m512i q01 = dot_pair<K>(join(weight_values<K>(w[i]), weight_values<K>(w[i + 1])),
                                        join(load256(x[i].qs), load256(x[i + 1].qs)));
        const __m512i q23 = dot_pair<K>(join(weight_values<K>(w[i + 2]), weight_values<K>(w[i + 3])),
                                        join(load256(x[i + 2].qs), load256(x[i + 3].qs)));
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q01), _mm512_permutexvar_ps(idx01, p512), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q23), _mm512_permutexvar_ps(idx23, p512), acc1);
    }
    if (i + 1 < nb) {   // a leftover pair
        const __m128i wh = _mm_setr_epi32(int(load_u32(&w[i])), int(load_u32(&w[i + 1])), 0, 0);
        const __m128i xh = _mm_setr_epi32(int(load_u32(&x[i])), int(load_u32(&x[i + 1])), 0, 0);
        const __m256 prod = _mm256_mul_ps(_mm256_cvtph_ps(wh), _mm256_cvtph_ps(xh));
        if constexpr (has_min) accm = _mm256_add_ps(accm, prod);
        const __m512i q01 = dot_pair<K>(join(weight_values<K>(w[i]), weight_values<K>(w[i + 1])),
                                        join(load256(x[i].qs), load256(x[i + 1].qs)));
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q01), _mm512_permutexvar_ps(idx01, _mm512_castps256_ps512(prod)),
                               acc0);
        i += 2;
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    if constexpr (has_min) {
        alignas(32) float m[8];
        _mm256_store_ps(m, accm);
        s += (m[1] + m[3]) + (m[5] + m[7]);
    }
    if (i < nb) {   // a last odd block, in the low half
        const __m512i p = dot_pair<K>(_mm512_zextsi256_si512(weight_values<K>(w[i])),
                                      _mm512_zextsi256_si512(load256(x[i].qs)));
        s += h2f(w[i].d) * h2f(x[i].d) * float(_mm512_reduce_add_epi32(p));
        if constexpr (has_min) s += h2f(w[i].m) * h2f(x[i].s);
    }
    return s;
}

// ---- float weights x F32 activations --------------------------------------------------------
template <int Kind>   // 0: F32, 1: F16, 2: BF16
inline __m512 load_weights16(const void* w, int64_t i, __mmask16 m) {
    if constexpr (Kind == 0) {
        return _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + i);
    } else {
        const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(w) + i);
        if constexpr (Kind == 1) return _mm512_cvtph_ps(h);
        else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

template <int Kind>
float dot_float(int64_t n, const void* w, const void* xv) {
    const float* x = static_cast<const float*>(xv);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(load_weights16<Kind>(w, i, 0xFFFF), _mm512_loadu_ps(x + i), acc0);
        acc1 = _mm512_fmadd_ps(load_weights16<Kind>(w, i + 16, 0xFFFF), _mm512_loadu_ps(x + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        const int64_t left = n - i;
        const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
        acc0 = _mm512_fmadd_ps(load_weights16<Kind>(w, i, m), _mm512_maskz_loadu_ps(m, x + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// ---- K-quants x Q8_K -----------------------------------------------------------------------
// Word index vectors selecting, for 32 words (2 runs of 16 or 4 runs of 8), the scale of the
// sub-block each word belongs to.
inline __m512i run_index(int first, int run) {
    alignas(64) int16_t idx[32];
    for (int w = 0; w < 32; ++w) idx[w] = int16_t(first + w / run);
    return _mm512_load_si512(idx);
}

template <bool Q5>
float dot_q45_k(int64_t n, const void* wv, const void* xv) {
    using WB = std::conditional_t<Q5, BlockQ5_K, BlockQ4_K>;
    const WB* w = static_cast<const WB*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    __m512i idx[4];
    for (int c = 0; c < 4; ++c) idx[c] = run_index(2 * c, 16);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        uint64_t sc, mn;
        unpack_scales_k4(w[i].scales, sc, mn);
        const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc))));
        // min term: sum_j mn_j * (bsum_2j + bsum_2j+1), mins repeated to match 16 bsums
        const __m128i mn8 = _mm_cvtsi64_si128(int64_t(mn));
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
        const __m256i prod_m = _mm256_madd_epi16(load256(x[i].bsums), mn16);
        __m512i qh2;
        if constexpr (Q5) {
            const __m256i qh = load256(w[i].qh);
            qh2 = join(qh, qh);
        }
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            const __m256i q = load256(w[i].qs + 32 * c);
            __m512i wq = _mm512_and_si512(join(q, _mm256_srli_epi16(q, 4)), m4);
            if constexpr (Q5) {
                const __m512i bits = join(_mm256_set1_epi8(char(1 << (2 * c))), _mm256_set1_epi8(char(2 << (2 * c))));
                const __mmask64 hi = _mm512_test_epi8_mask(qh2, bits);
                wq = _mm512_mask_add_epi8(wq, hi, wq, _mm512_set1_epi8(16));
            }
            const __m512i p16 = _mm512_maddubs_epi16(wq, _mm512_loadu_si512(x[i].qs + 64 * c));
            sumi = _mm512_dpwssd_epi32(sumi, p16, _mm512_permutexvar_epi16(idx[c], scales));
        }
        const float d = h2f(w[i].d) * x[i].d, dmin = h2f(w[i].dmin) * x[i].d;
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(d), acc);
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod_m), _mm256_set1_ps(dmin), accm);
    }
    const __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm), _mm256_extractf128_ps(accm, 1));
    const __m128 m2 = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(_mm_add_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
}

float dot_q6_k(int64_t n, const void* wv, const void* xv) {
    const BlockQ6_K* w = static_cast<const BlockQ6_K*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    __m512i idx[4];
    for (int k = 0; k < 4; ++k) idx[k] = run_index(4 * k, 8);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x03);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].scales)));
        const __m512i scales = _mm512_castsi256_si512(sc16);
        // q - 32 offset: sum_g sc_g * 32 * bsum_g
        const __m256i bias = _mm256_madd_epi16(sc16, load256(x[i].bsums));
        __m512i sumi = _mm512_slli_epi32(_mm512_zextsi256_si512(bias), 5);
        sumi = _mm512_sub_epi32(_mm512_setzero_si512(), sumi);
        for (int h = 0; h < 2; ++h) {
            const __m512i ql = _mm512_loadu_si512(w[i].ql + 64 * h);
            const __m256i qh = load256(w[i].qh + 32 * h);
            const __m512i qh01 = _mm512_and_si512(join(qh, _mm256_srli_epi16(qh, 2)), m2);
            const __m512i qh23 = _mm512_and_si512(join(_mm256_srli_epi16(qh, 4), _mm256_srli_epi16(qh, 6)), m2);
            const __m512i w01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(qh01, 4));
            const __m512i w23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                _mm512_slli_epi16(qh23, 4));
            const __m512i p01 = _mm512_maddubs_epi16(w01, _mm512_loadu_si512(x[i].qs + 128 * h));
            const __m512i p23 = _mm512_maddubs_epi16(w23, _mm512_loadu_si512(x[i].qs + 128 * h + 64));
            sumi = _mm512_dpwssd_epi32(sumi, p01, _mm512_permutexvar_epi16(idx[2 * h], scales));
            sumi = _mm512_dpwssd_epi32(sumi, p23, _mm512_permutexvar_epi16(idx[2 * h + 1], scales));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// ---- table types: MXFP4, IQ4_NL x Q8_0 and IQ4_XS x Q8_K ------------------------------------
// Nibbles looked up with vpshufb in the 16-entry table (every 128-bit lane holds it). s16 pair sums
// of |x| against the values carrying x's sign: a Q8_K -128 is exact as the unsigned 128, and
// |pair| <= 2 * 128 * 127 does not saturate. (AVX512BW only, no VNNI.)
inline __m512i table16(const int8_t* t) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
}
inline __m512i pairs_table(__m512i v, __m512i x) {
    const __mmask64 neg = _mm512_movepi8_mask(x);
    return _mm512_maddubs_epi16(_mm512_abs_epi8(x), _mm512_mask_sub_epi8(v, neg, _mm512_setzero_si512(), v));
}
inline float table_scale(const BlockMXFP4& b) { return e8m0_half(b.e); }
inline float table_scale(const BlockIQ4_NL& b) { return h2f(b.d); }

// Two blocks a vector (lanes 0-7 block i, 8-15 block i + 1), each lane scaled by its block's d_w * d_x.
template <class WB>
float dot_table(int64_t n, const void* wv, const void* xv) {
    const WB* w = static_cast<const WB*>(wv);
    const BlockQ8_0* x = static_cast<const BlockQ8_0*>(xv);
    const __m512i table = table16(std::is_same<WB, BlockMXFP4>::value ? kvalues_mxfp4 : kvalues_iq4nl);
    const __m512i ones = _mm512_set1_epi16(1);
    const int64_t nb = n / 32;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    auto pair = [&](int64_t i, __m512& acc) {
        const __m512i v = _mm512_shuffle_epi8(table, join(nibbles32(w[i].qs), nibbles32(w[i + 1].qs)));
        const __m512i p = _mm512_madd_epi16(pairs_table(v, join(load256(x[i].qs), load256(x[i + 1].qs))), ones);
        const __m512 d = _mm512_insertf32x8(_mm512_set1_ps(table_scale(w[i]) * h2f(x[i].d)),
                                            _mm256_set1_ps(table_scale(w[i + 1]) * h2f(x[i + 1].d)), 1);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, acc);
    };
    int64_t i = 0;
    for (; i + 3 < nb; i += 4) {
        pair(i, acc0);
        pair(i + 2, acc1);
    }
    if (i + 1 < nb) {
        pair(i, acc0);
        i += 2;
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    if (i < nb) {   // a last odd block, in the low half
        const __m512i v = _mm512_shuffle_epi8(table, _mm512_zextsi256_si512(nibbles32(w[i].qs)));
        const __m512i p = _mm512_madd_epi16(pairs_table(v, _mm512_zextsi256_si512(load256(x[i].qs))), ones);
        s += table_scale(w[i]) * h2f(x[i].d) * float(_mm512_reduce_add_epi32(p));
    }
    return s;
}

// Two sub-blocks of 32 a vector, their pair sums times their scales (int16 runs of 16 lanes).
float dot_iq4_xs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ4_XS* w = static_cast<const BlockIQ4_XS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const __m512i table = table16(kvalues_iq4nl);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            const __m512i v = _mm512_shuffle_epi8(table,
                                                  join(nibbles32(w[i].qs + 32 * c), nibbles32(w[i].qs + 32 * c + 16)));
            const __m512i p = pairs_table(v, _mm512_loadu_si512(x[i].qs + 64 * c));
            const __m512i sc = join(_mm256_set1_epi16(int16_t(iq4_xs_scale(w[i], 2 * c))),
                                    _mm256_set1_epi16(int16_t(iq4_xs_scale(w[i], 2 * c + 1))));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, sc));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// The grid types: two sub-blocks a vector, their 16 grid points gathered by idx; the pair's 64 sign
// bits (as they lie in memory: bit e for element e) are the byte mask of the negation.
// sc: the integer scale of each 16-bit pair lane (8 lanes: 16 values).
inline __m512i grid_sub_blocks(const int* grid, __m512i idx, uint64_t signs, __m512i sc, const int8_t* x) {
    const __m512i g = _mm512_i32gather_epi32(idx, grid, 4);
    const __m512i v = _mm512_mask_sub_epi8(g, __mmask64(signs), _mm512_setzero_si512(), g);
    return _mm512_madd_epi16(pairs_table(v, _mm512_loadu_si512(x)), sc);
}
inline __m512i grid_sub_blocks(const int* grid, __m512i idx, uint64_t signs, int sc0, int sc1, const int8_t* x) {
    return grid_sub_blocks(grid, idx, signs, join(_mm256_set1_epi16(int16_t(sc0)), _mm256_set1_epi16(int16_t(sc1))), x);
}

inline __m512i points16(const uint8_t* qs) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
}

float dot_iq3_s(int64_t n, const void* wv, const void* xv) {
    const BlockIQ3_S* w = static_cast<const BlockIQ3_S*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq3s_grid.v);
    const __m512i bit_of_point = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            const __m512i qh = _mm512_inserti64x4(_mm512_set1_epi32(w[i].qh[2 * c]),
                                                  _mm256_set1_epi32(w[i].qh[2 * c + 1]), 1);
            const __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(qh, bit_of_point), _mm512_set1_epi32(1));
            const __m512i idx = _mm512_or_si512(points16(w[i].qs + 16 * c), _mm512_slli_epi32(hi, 8));
            uint64_t signs;
            std::memcpy(&signs, w[i].signs + 8 * c, 8);
            const int s0 = 1 + 2 * (w[i].scales[c] & 0x0F), s1 = 1 + 2 * (w[i].scales[c] >> 4);
            sumi = _mm512_add_epi32(sumi, grid_sub_blocks(grid, idx, signs, s0, s1, x[i].qs + 64 * c));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

float dot_iq3_xxs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ3_XXS* w = static_cast<const BlockIQ3_XXS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq3xxs_grid.v);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            const uint32_t a0 = iq3_xxs_aux(w[i], 2 * c), a1 = iq3_xxs_aux(w[i], 2 * c + 1);
            const uint64_t signs = uint64_t(iq2_signs32(a0)) | uint64_t(iq2_signs32(a1)) << 32;
            sumi = _mm512_add_epi32(sumi,
                                    grid_sub_blocks(grid, points16(w[i].qs + 16 * c), signs, 2 * int(a0 >> 28) + 1,
                                                    2 * int(a1 >> 28) + 1, x[i].qs + 64 * c));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * 0.25f * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// IQ2_XXS: the 8-value points of two sub-blocks (grid words 2 p, 2 p + 1 of point p), p the bytes
// of each sub-block's first word; signs and scales as IQ3_XXS's, d / 8.
float dot_iq2_xxs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ2_XXS* w = static_cast<const BlockIQ2_XXS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq2xxs_grid.v);
    const __m128i twice = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i half = _mm512_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            uint32_t aux[4];
            std::memcpy(aux, w[i].qs + 16 * c, 16);
            const __m512i p = _mm512_cvtepu8_epi32(
                _mm_shuffle_epi8(_mm_setr_epi32(int(aux[0]), int(aux[2]), 0, 0), twice));
            const __m512i idx = _mm512_add_epi32(_mm512_slli_epi32(p, 1), half);
            const uint64_t signs = uint64_t(iq2_signs32(aux[1])) | uint64_t(iq2_signs32(aux[3])) << 32;
            sumi = _mm512_add_epi32(sumi, grid_sub_blocks(grid, idx, signs, 2 * int(aux[1] >> 28) + 1,
                                                          2 * int(aux[3] >> 28) + 1, x[i].qs + 64 * c));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * 0.125f * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// IQ2_XS: two sub-blocks' 8 points (qs[l] & 511: grid words 2 p, 2 p + 1), signs ksigns_iq2xs[qs[l] >> 9],
// a scale 2 s + 1 per 16 values, d / 8.
float dot_iq2_xs(int64_t n, const void* wv, const void* xv) {
    const BlockIQ2_XS* w = static_cast<const BlockIQ2_XS*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq2xs_grid.v);
    const __m256i twice = _mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i half = _mm512_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            const uint16_t* q = w[i].qs + 8 * c;
            const __m256i q8 = _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
            const __m512i p = _mm512_and_si512(_mm512_cvtepu16_epi32(_mm256_permutexvar_epi16(twice, q8)),
                                               _mm512_set1_epi32(511));
            const __m512i idx = _mm512_add_epi32(_mm512_slli_epi32(p, 1), half);
            uint64_t signs = 0;
            for (int l = 0; l < 8; ++l) signs |= uint64_t(ksigns_iq2xs[q[l] >> 9]) << (8 * l);
            const uint8_t s0 = w[i].scales[2 * c], s1 = w[i].scales[2 * c + 1];
            const __m256i sc0 = _mm256_inserti128_si256(_mm256_set1_epi16(int16_t(2 * (s0 & 0x0F) + 1)),
                                                        _mm_set1_epi16(int16_t(2 * (s0 >> 4) + 1)), 1);
            const __m256i sc1 = _mm256_inserti128_si256(_mm256_set1_epi16(int16_t(2 * (s1 & 0x0F) + 1)),
                                                        _mm_set1_epi16(int16_t(2 * (s1 >> 4) + 1)), 1);
            sumi = _mm512_add_epi32(sumi, grid_sub_blocks(grid, idx, signs, join(sc0, sc1), x[i].qs + 64 * c));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * 0.125f * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// IQ2_S: as IQ2_XS, point l's 10-bit index from qs and qh and its signs a byte (64 bits a pair of
// sub-blocks, as they lie in memory).
float dot_iq2_s(int64_t n, const void* wv, const void* xv) {
    const BlockIQ2_S* w = static_cast<const BlockIQ2_S*>(wv);
    const BlockQ8_K* x = static_cast<const BlockQ8_K*>(xv);
    const int* grid = reinterpret_cast<const int*>(iq2s_grid.v);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            alignas(64) int idx[16];
            for (int l = 0; l < 8; ++l) {
                idx[2 * l] = 2 * int(iq2_s_point(w[i], 8 * c + l));
                idx[2 * l + 1] = idx[2 * l] + 1;
            }
            uint64_t signs;
            std::memcpy(&signs, w[i].signs + 8 * c, 8);
            const uint8_t s0 = w[i].scales[2 * c], s1 = w[i].scales[2 * c + 1];
            const __m256i sc0 = _mm256_inserti128_si256(_mm256_set1_epi16(int16_t(2 * (s0 & 0x0F) + 1)),
                                                        _mm_set1_epi16(int16_t(2 * (s0 >> 4) + 1)), 1);
            const __m256i sc1 = _mm256_inserti128_si256(_mm256_set1_epi16(int16_t(2 * (s1 & 0x0F) + 1)),
                                                        _mm_set1_epi16(int16_t(2 * (s1 >> 4) + 1)), 1);
            sumi = _mm512_add_epi32(
                sumi, grid_sub_blocks(grid, _mm512_load_si512(idx), signs, join(sc0, sc1), x[i].qs + 64 * c));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(h2f(w[i].d) * 0.125f * x[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

}  // namespace

VecDotFn vec_dot_avx512(GGMLType type) {
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
        case GGMLType::Q3_K: return vec_dot_q2_q3_avx512(type);
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
        default: return vec_dot_low_bit_avx512(type);
    }
}

}  // namespace ember
