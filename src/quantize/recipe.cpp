// The per-tensor type recipe, following llama.cpp's llama_tensor_get_type for the mixes ember
// supports: output head Q6_K (Q8_0 where rows are not a multiple of 256), *_K_M give Q6_K to
// attn_v and ffn_down in the first and last eighth of layers and every third layer between, Q2_K
// and Q3_K_M / Q3_K_L (IQ3_M) give attn_v, ffn_down, attn_output (and attn_qkv) more bits, the IQ2 / IQ1 mixes
// attn_v, the first ffn_down and attn_output, and K types fall back to legacy ones (IQ types to IQ4_NL) when a row is
// not a whole number of 256-element blocks.
#include "quantize/recipe.h"

#include <cctype>

#include "ember/status.h"
#include "quant/kernels.h"
#include "quant/quant_weighted.h"

namespace ember {

QuantizeRowFn weight_quantizer(GGMLType t) {
    switch (t) {
        // the traits' IQ4_NL quantizer is the KV cache's single fit; weights take IQ4_XS's scale search
        case GGMLType::IQ4_NL: return quantize_row_iq4_nl_search;
        case GGMLType::IQ3_XXS:
            return [](const float* src, void* dst, int64_t n) { quantize_iq3_xxs_weighted(src, dst, n, nullptr); };
        case GGMLType::IQ3_S:
            return [](const float* src, void* dst, int64_t n) { quantize_iq3_s_weighted(src, dst, n, nullptr); };
        case GGMLType::IQ2_S:
            return [](const float* src, void* dst, int64_t n) { quantize_iq2_s_weighted(src, dst, n, nullptr); };
        case GGMLType::IQ1_M:
            return [](const float* src, void* dst, int64_t n) { quantize_iq1_m_weighted(src, dst, n, nullptr); };
        default: return type_traits(t).quantize_row;
    }
}

bool needs_imatrix(GGMLType t) {
    return t == GGMLType::IQ3_XXS || t == GGMLType::IQ2_XXS || t == GGMLType::IQ2_XS || t == GGMLType::IQ2_S ||
           t == GGMLType::IQ1_S || t == GGMLType::IQ1_M;
}

namespace {

const QuantMix kMixes[] = {
    {"F32", GGMLType::F32, 0, false},
    {"F16", GGMLType::F16, 1, false},
    {"BF16", GGMLType::BF16, 32, false},
    {"Q4_0", GGMLType::Q4_0, 2, false},
    {"Q4_1", GGMLType::Q4_1, 3, false},
    {"Q8_0", GGMLType::Q8_0, 7, false},
    {"Q5_0", GGMLType::Q5_0, 8, false},
    {"Q5_1", GGMLType::Q5_1, 9, false},
    // Plain Q4_K / Q5_K (every matrix in the base type) record the nearest llama ftype, *_K_S.
    {"Q4_K", GGMLType::Q4_K, 14, false},
    {"Q4_K_M", GGMLType::Q4_K, 15, true},
    {"Q5_K", GGMLType::Q5_K, 16, false},
    {"Q5_K_M", GGMLType::Q5_K, 17, true},
    {"Q6_K", GGMLType::Q6_K, 18, false},
    {"MXFP4_MOE", GGMLType::Q8_0, 38, false, true},
    {"Q2_K", GGMLType::Q2_K, 10, false, false, LowKMix::q2_k},
    {"Q3_K_S", GGMLType::Q3_K, 11, false},
    {"Q3_K_M", GGMLType::Q3_K, 12, false, false, LowKMix::q3_k_m},
    {"Q3_K_L", GGMLType::Q3_K, 13, false, false, LowKMix::q3_k_l},
    {"IQ4_XS", GGMLType::IQ4_XS, 30, false, false, LowKMix::iq4_xs},
    {"IQ3_S", GGMLType::IQ3_S, 26, false, false, LowKMix::iq3_s},
    {"IQ3_M", GGMLType::IQ3_S, 27, false, false, LowKMix::iq3_m},
    {"IQ3_XXS", GGMLType::IQ3_XXS, 23, false, false, LowKMix::iq3_xxs},
    {"IQ2_XXS", GGMLType::IQ2_XXS, 19, false, false, LowKMix::iq2_xxs},
    {"IQ2_XS", GGMLType::IQ2_XS, 20, false, false, LowKMix::iq2_xs},
    {"IQ2_S", GGMLType::IQ2_XS, 28, false, false, LowKMix::iq2_s},
    {"IQ2_M", GGMLType::IQ2_S, 29, false, false, LowKMix::iq2_m},
    {"IQ1_S", GGMLType::IQ1_S, 24, false, false, LowKMix::iq1_s},
    {"IQ1_M", GGMLType::IQ1_M, 31, false, false, LowKMix::iq1_m},
};

// The IQ2 and IQ1 mixes share llama.cpp's rules: attn_v, the first eighth's ffn_down (and attn_output, but in
// IQ2_XXS / IQ2_XS) get more bits, every other rule of the chain is skipped.
bool is_iq2_mix(LowKMix m) {
    return m == LowKMix::iq2_xxs || m == LowKMix::iq2_xs || m == LowKMix::iq2_s || m == LowKMix::iq2_m ||
           m == LowKMix::iq1_s || m == LowKMix::iq1_m;
}

bool is_iq1_mix(LowKMix m) { return m == LowKMix::iq1_s || m == LowKMix::iq1_m; }

// The type llama.cpp gives the IQ2 mixes' more-bits tensors: IQ3_S for IQ2_S / IQ2_M, Q2_K for the others.
GGMLType iq2_more_bits(LowKMix m) {
    return m == LowKMix::iq2_s || m == LowKMix::iq2_m ? GGMLType::IQ3_S : GGMLType::Q2_K;
}

// The output head: Q8_0 on rows not a multiple of 256, Q5_K in the IQ1 / IQ2 / IQ3_XXS mixes, else Q6_K (Q8_0 for Q8_0).
GGMLType output_type(const QuantMix& mix, const GGUFTensor& t) {
    if (t.ne[0] % 256 != 0 || mix.base == GGMLType::Q8_0) return GGMLType::Q8_0;
    if (is_iq2_mix(mix.low_k) || mix.low_k == LowKMix::iq3_xxs) return GGMLType::Q5_K;
    return GGMLType::Q6_K;
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The super-block types with a 32-element fallback (k_fallback).
bool is_k_type(GGMLType t) {
    return t == GGMLType::Q2_K || t == GGMLType::Q3_K || t == GGMLType::Q4_K || t == GGMLType::Q5_K ||
           t == GGMLType::Q6_K || t == GGMLType::IQ4_XS || t == GGMLType::IQ3_XXS || t == GGMLType::IQ3_S ||
           t == GGMLType::IQ2_XXS || t == GGMLType::IQ2_XS || t == GGMLType::IQ2_S || t == GGMLType::IQ1_S ||
           t == GGMLType::IQ1_M;
}

// Q8_1 and Q8_K are the activations' dot-product formats, never stored in model files.
bool is_storage_type(const TypeTraits& tr) {
    const bool weighted = tr.type == GGMLType::IQ2_XXS || tr.type == GGMLType::IQ2_XS ||   // importances only
                          tr.type == GGMLType::IQ1_S;
    return (weight_quantizer(tr.type) || weighted) && tr.type != GGMLType::Q8_1 && tr.type != GGMLType::Q8_K;
}

std::string upper(const std::string& s) {
    std::string up;
    for (char c : s) up += (char)std::toupper((unsigned char)c);
    return up;
}

std::string storage_type_names() {
    std::string s;
    for (uint32_t id = 0; id < 64; ++id)
        if (const TypeTraits* tr = find_type_traits(id); tr && is_storage_type(*tr))
            s += (s.empty() ? "" : ", ") + std::string(tr->name);
    return s;
}

GGMLType k_fallback(GGMLType t) {
    switch (t) {
        case GGMLType::Q2_K:
        case GGMLType::Q3_K: return GGMLType::Q4_0;
        case GGMLType::IQ1_S:
        case GGMLType::IQ1_M:
        case GGMLType::IQ2_XXS:
        case GGMLType::IQ2_XS:
        case GGMLType::IQ2_S:
        case GGMLType::IQ3_XXS:
        case GGMLType::IQ3_S:
        case GGMLType::IQ4_XS: return GGMLType::IQ4_NL;
        case GGMLType::Q4_K: return GGMLType::Q5_0;
        case GGMLType::Q5_K: return GGMLType::Q5_1;
        case GGMLType::Q6_K: return GGMLType::Q8_0;
        default: return t;
    }
}

}  // namespace

const QuantMix* find_quant_mix(const std::string& name) {
    const std::string up = upper(name);
    for (const auto& m : kMixes)
        if (up == m.name) return &m;
    return nullptr;
}

std::string quant_mix_names() {
    std::string s;
    for (const auto& m : kMixes) s += (s.empty() ? "" : ", ") + std::string(m.name);
    return s;
}

GGMLType choose_type(const QuantMix& mix, const GGUFTensor& t, RecipeState& st) {
    // Only 2-D weight matrices are quantized; norms, biases and other vectors stay F32.
    if (t.ne.size() < 2 || !ends_with(t.name, ".weight")) return GGMLType::F32;
    GGMLType type = mix.base;
    const bool float_mix = mix.base == GGMLType::F32 || mix.base == GGMLType::F16 || mix.base == GGMLType::BF16;
    const bool is_output = t.name == "output.weight" || (!st.has_output && t.name == "token_embd.weight");
    if (mix.experts_mxfp4) {
        // llama.cpp's MXFP4_MOE: the router stays unquantized; a 3-D tensor (a matrix an expert) is
        // MXFP4; every other matrix, the output head included, the base Q8_0
        if (ends_with(t.name, "ffn_gate_inp.weight")) return GGMLType::F32;
        if (t.ne.size() > 2 && t.ne[2] > 1) type = GGMLType::MXFP4;
    } else if (!float_mix && is_output) {
        type = output_type(mix, t);
    } else if (t.name == "token_embd.weight") {
        if (mix.low_k == LowKMix::iq2_xxs || mix.low_k == LowKMix::iq2_xs || is_iq1_mix(mix.low_k))
            type = GGMLType::Q2_K;
        if (mix.low_k == LowKMix::iq2_s || mix.low_k == LowKMix::iq2_m || mix.low_k == LowKMix::iq3_xxs)
            type = GGMLType::IQ3_S;
    } else if (is_iq2_mix(mix.low_k)) {
        if (ends_with(t.name, "attn_v.weight")) {
            type = st.n_gqa >= 4 ? GGMLType::Q4_K : iq2_more_bits(mix.low_k);
            ++st.i_attn_v;
        } else if (ends_with(t.name, "ffn_down.weight")) {
            if (st.i_ffn_down < st.n_ffn_down / 8) type = iq2_more_bits(mix.low_k);
            ++st.i_ffn_down;
        } else if (ends_with(t.name, "attn_output.weight")) {
            if (mix.low_k == LowKMix::iq2_s || mix.low_k == LowKMix::iq2_m) type = GGMLType::IQ3_S;
            if (is_iq1_mix(mix.low_k)) type = GGMLType::IQ2_XXS;
        }
    } else if (ends_with(t.name, "attn_v.weight")) {
        if (mix.more_bits_k && use_more_bits(st.i_attn_v, st.n_attn_v)) type = GGMLType::Q6_K;
        if (mix.low_k == LowKMix::q2_k) type = st.n_gqa >= 4 ? GGMLType::Q4_K : GGMLType::Q3_K;
        if (mix.low_k == LowKMix::q3_k_m) type = st.i_attn_v < 2 ? GGMLType::Q5_K : GGMLType::Q4_K;
        if (mix.low_k == LowKMix::q3_k_l) type = GGMLType::Q5_K;
        if (mix.low_k == LowKMix::iq4_xs && st.n_gqa >= 4) type = GGMLType::Q5_K;
        if ((mix.low_k == LowKMix::iq3_s && st.n_gqa >= 4) || mix.low_k == LowKMix::iq3_m) type = GGMLType::Q4_K;
        if (mix.low_k == LowKMix::iq3_xxs)
            type = st.n_gqa >= 4 ? GGMLType::Q4_K : (st.has_imatrix ? GGMLType::IQ3_XXS : GGMLType::IQ3_S);
        ++st.i_attn_v;
    } else if (ends_with(t.name, "attn_k.weight") || ends_with(t.name, "attn_q.weight")) {
        if (mix.low_k == LowKMix::iq3_xxs) type = GGMLType::IQ2_S;
    } else if (ends_with(t.name, "ffn_down.weight")) {
        if (mix.more_bits_k && use_more_bits(st.i_ffn_down, st.n_ffn_down)) type = GGMLType::Q6_K;
        if (mix.low_k == LowKMix::q2_k) type = GGMLType::Q3_K;
        if (mix.low_k == LowKMix::q3_k_m) type = st.i_ffn_down < st.n_ffn_down / 16 ? GGMLType::Q5_K : GGMLType::Q4_K;
        if (mix.low_k == LowKMix::q3_k_l) type = GGMLType::Q5_K;
        if (mix.low_k == LowKMix::iq4_xs && !st.has_imatrix && st.i_ffn_down < st.n_ffn_down / 8) type = GGMLType::Q5_K;
        if (mix.low_k == LowKMix::iq3_m && st.i_ffn_down < st.n_ffn_down / 8) type = GGMLType::Q4_K;
        if (mix.low_k == LowKMix::iq3_xxs && !st.has_imatrix)
            type = st.i_ffn_down < st.n_ffn_down / 8 ? GGMLType::Q4_K : GGMLType::Q3_K;
        ++st.i_ffn_down;
    } else if (ends_with(t.name, "attn_output.weight")) {
        if (mix.low_k == LowKMix::q2_k) type = GGMLType::Q3_K;
        if (mix.low_k == LowKMix::q3_k_m) type = GGMLType::Q4_K;
        if (mix.low_k == LowKMix::q3_k_l) type = GGMLType::Q5_K;
        if (mix.low_k == LowKMix::iq3_m) type = GGMLType::Q4_K;
        if (mix.low_k == LowKMix::iq3_xxs) type = GGMLType::IQ3_S;
    } else if (ends_with(t.name, "attn_qkv.weight")) {
        if (mix.low_k == LowKMix::q3_k_m || mix.low_k == LowKMix::q3_k_l || mix.low_k == LowKMix::iq3_m)
            type = GGMLType::Q4_K;
    }
    if (is_k_type(type) && t.ne[0] % 256 != 0) type = k_fallback(type);
    const TypeTraits& tr = type_traits(type);
    if (t.ne[0] % tr.block_elems != 0) type = GGMLType::F16;   // rows too short for any block: keep precision
    return type;
}

GGMLType parse_tensor_type(const std::string& name, const char* option) {
    const std::string up = upper(name);
    for (uint32_t id = 0; id < 64; ++id)
        if (const TypeTraits* tr = find_type_traits(id); tr && is_storage_type(*tr) && up == tr->name) return tr->type;
    fail(option, ": unknown tensor type '", name, "'; choose one of: ", storage_type_names());
}

TypeOverrides parse_type_overrides(const std::vector<std::string>& tensor_types, const std::string& output_type,
                                   const std::string& token_embd_type) {
    TypeOverrides ov;
    for (const auto& spec : tensor_types) {
        const size_t eq = spec.rfind('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
            fail("--tensor-type: expected REGEX=TYPE (e.g. 'attn_v=Q6_K'), got '", spec, "'");
        const std::string pattern = spec.substr(0, eq);
        std::regex re;
        try {
            re = std::regex(pattern);
        } catch (const std::regex_error& e) {
            fail("--tensor-type: bad regular expression '", pattern, "': ", e.what());
        }
        ov.tensor_types.emplace_back(std::move(re), parse_tensor_type(spec.substr(eq + 1), "--tensor-type"));
        ov.patterns.push_back(pattern);
    }
    if (!output_type.empty()) ov.output = parse_tensor_type(output_type, "--output-tensor-type");
    if (!token_embd_type.empty()) ov.token_embd = parse_tensor_type(token_embd_type, "--token-embedding-type");
    return ov;
}

GGMLType apply_overrides(const TypeOverrides& ov, const GGUFTensor& t, GGMLType chosen, bool has_output) {
    // As llama-quantize: only the weight matrices the recipe quantizes can be overridden.
    if (t.ne.size() < 2 || !ends_with(t.name, ".weight")) return chosen;
    GGMLType type = chosen;
    std::string why;
    for (size_t i = 0; i < ov.tensor_types.size(); ++i)
        if (std::regex_search(t.name, ov.tensor_types[i].first)) {
            type = ov.tensor_types[i].second;
            why = "--tensor-type '" + ov.patterns[i] + "'";
        }
    if (ov.output && (t.name == "output.weight" || (!has_output && t.name == "token_embd.weight"))) {
        type = *ov.output;
        why = "--output-tensor-type";
    }
    if (ov.token_embd && t.name == "token_embd.weight") {
        type = *ov.token_embd;
        why = "--token-embedding-type";
    }
    if (type == chosen) return type;
    if (is_k_type(type) && t.ne[0] % 256 != 0) type = k_fallback(type);
    const TypeTraits& tr = type_traits(type);
    if (t.ne[0] % tr.block_elems != 0)
        fail(why, ": tensor '", t.name, "' has rows of ", t.ne[0], " elements, not a multiple of ", tr.name,
             "'s blocks of ", tr.block_elems, " (K types fall back as the recipe does: Q4_K -> Q5_0, Q5_K -> Q5_1, ",
             "Q6_K -> Q8_0; choose a type whose blocks divide the rows, or F16)");
    return type;
}

}  // namespace ember
