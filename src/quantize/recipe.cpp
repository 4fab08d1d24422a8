// The per-tensor type recipe, following llama.cpp's llama_tensor_get_type for the mixes ember supports: which
// tensors may change type at all (2-D / 3-D weights, not norms, routers or conv1d kernels), then by llama.cpp's
// name categories (attn_qkv and attn_kv_b ruled as attn_v; every ffn_down* tensor, experts' by their layer): output
// head Q6_K (Q8_0 where rows are not a multiple of 256), *_K_M give Q6_K to attn_v and ffn_down in the first and
// last eighth of layers and every third layer between, Q2_K and Q3_K_M / Q3_K_L (IQ3_M) give attn_v, ffn_down and
// attn_output more bits, 8-expert models' attention more, the IQ2 / IQ1 mixes attn_v, the first ffn_down and
// attn_output, and K types fall back to legacy ones (IQ types to IQ4_NL) when a row is not a whole number of
// 256-element blocks.
#include "quantize/recipe.h"

#include <cctype>
#include <cstdio>

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
    {"IQ4_NL", GGMLType::IQ4_NL, 25, false, false, LowKMix::iq4},
    {"IQ4_XS", GGMLType::IQ4_XS, 30, false, false, LowKMix::iq4},
    {"IQ3_S", GGMLType::IQ3_S, 26, false, false, LowKMix::iq3_s},
    {"IQ3_M", GGMLType::IQ3_S, 27, false, false, LowKMix::iq3_m},
    {"IQ3_XXS", GGMLType::IQ3_XXS, 23, false, false, LowKMix::iq3_xxs},
    {"IQ2_XXS", GGMLType::IQ2_XXS, 19, false, false, LowKMix::iq2_xxs},
    {"IQ2_XS", GGMLType::IQ2_XS, 20, false, false, LowKMix::iq2_xs},
    {"IQ2_S", GGMLType::IQ2_XS, 28, false, false, LowKMix::iq2_s},
    {"IQ2_M", GGMLType::IQ2_S, 29, false, false, LowKMix::iq2_m},
    {"IQ1_S", GGMLType::IQ1_S, 24, false, false, LowKMix::iq1_s},
    {"IQ1_M", GGMLType::IQ1_M, 31, false, false, LowKMix::iq1_m},
    {"TQ1_0", GGMLType::TQ1_0, 36, false, false, LowKMix::tq},
    {"TQ2_0", GGMLType::TQ2_0, 37, false, false, LowKMix::tq},
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
           t == GGMLType::IQ1_M || t == GGMLType::TQ1_0 || t == GGMLType::TQ2_0;
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
        case GGMLType::Q3_K:
        case GGMLType::TQ1_0:
        case GGMLType::TQ2_0: return GGMLType::Q4_0;
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

namespace {

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// llama.cpp's broad tensor categories, by name part, first match wins: attn_qkv before attn_v, and the ffn_*
// parts match the expert (_exps) and shared-expert (_shexp) tensors too.
enum class Category {
    token_embd,
    output,
    attn_qkv,
    attn_kv_b,
    attn_v,
    attn_k,
    attn_q,
    attn_output,
    ffn_up,
    ffn_gate,
    ffn_down,
    other
};

Category category(const std::string& name) {
    if (name == "output.weight") return Category::output;
    if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Category::token_embd;
    if (contains(name, "attn_qkv.weight")) return Category::attn_qkv;
    if (contains(name, "attn_kv_b.weight")) return Category::attn_kv_b;
    if (contains(name, "attn_v.weight")) return Category::attn_v;
    if (contains(name, "attn_k.weight")) return Category::attn_k;
    if (contains(name, "attn_q.weight")) return Category::attn_q;
    if (contains(name, "attn_output.weight")) return Category::attn_output;
    if (contains(name, "ffn_up")) return Category::ffn_up;
    if (contains(name, "ffn_gate")) return Category::ffn_gate;
    if (contains(name, "ffn_down")) return Category::ffn_down;
    return Category::other;
}

// The fused and MLA value projections take attn_v's rules (and share its layer count).
bool is_attn_v_like(Category c) { return c == Category::attn_v || c == Category::attn_qkv || c == Category::attn_kv_b; }

// ggml's dimension count: trailing dimensions of 1 do not count ([n, 1] is a vector).
size_t n_dims(const GGUFTensor& t) {
    size_t n = t.ne.size();
    while (n > 1 && t.ne[n - 1] == 1) --n;
    return n;
}

// The mixes whose attn_output llama.cpp raises to Q5_K in 8-expert models (Q2_K, Q3_K_S/M, Q4_K_M, IQ3_*, IQ4_NL,
// IQ4_XS).
bool attn_output_q5_k_with_8_experts(const QuantMix& mix) {
    switch (mix.file_type) {
        case 10:
        case 11:
        case 12:
        case 15:
        case 23:
        case 25:
        case 26:
        case 27:
        case 30: return true;
        default: return false;
    }
}

// The recipe's type for a tensor in category c (before the block-size fallback), llama_tensor_get_type's chain.
GGMLType recipe_type(const QuantMix& mix, const GGUFTensor& t, Category c, RecipeState& st) {
    GGMLType type = mix.base;
    const bool is_output = c == Category::output || (!st.has_output && c == Category::token_embd);
    const LowKMix k = mix.low_k;
    if (is_output) return output_type(mix, t);
    if (mix.experts_mxfp4) return t.ne.size() > 2 && t.ne[2] > 1 ? GGMLType::MXFP4 : mix.base;
    if (c == Category::token_embd) {
        if (k == LowKMix::iq2_xxs || k == LowKMix::iq2_xs || is_iq1_mix(k)) return GGMLType::Q2_K;
        if (k == LowKMix::iq2_s || k == LowKMix::iq2_m || k == LowKMix::iq3_xxs) return GGMLType::IQ3_S;
        if (k == LowKMix::tq) return GGMLType::Q4_K;
        return type;
    }
    if (is_iq2_mix(k)) {
        if (is_attn_v_like(c)) {
            type = st.n_gqa >= 4 || st.n_expert >= 4 ? GGMLType::Q4_K : iq2_more_bits(k);
            ++st.i_attn_v;
        } else if (st.n_expert == 8 && c == Category::attn_k) {
            type = GGMLType::Q4_K;
        } else if (c == Category::ffn_down) {
            if (st.i_ffn_down < st.n_ffn_down / 8) type = iq2_more_bits(k);
            ++st.i_ffn_down;
        } else if (c == Category::attn_output) {
            if (st.n_expert == 8) type = GGMLType::Q5_K;
            else if (is_iq1_mix(k)) type = GGMLType::IQ2_XXS;
            else if (k == LowKMix::iq2_s || k == LowKMix::iq2_m) type = GGMLType::IQ3_S;
        }
        return type;
    }
    if (is_attn_v_like(c)) {
        if (k == LowKMix::q2_k) type = st.n_gqa >= 4 ? GGMLType::Q4_K : GGMLType::Q3_K;
        else if (k == LowKMix::iq3_xxs)
            type = st.n_gqa >= 4 ? GGMLType::Q4_K : (st.has_imatrix ? GGMLType::IQ3_XXS : GGMLType::IQ3_S);
        else if (k == LowKMix::iq3_s && st.n_gqa >= 4) type = GGMLType::Q4_K;
        else if (k == LowKMix::iq3_m) type = GGMLType::Q4_K;
        else if (k == LowKMix::q3_k_m) type = st.i_attn_v < 2 ? GGMLType::Q5_K : GGMLType::Q4_K;
        else if (k == LowKMix::q3_k_l) type = GGMLType::Q5_K;
        else if (k == LowKMix::iq4 && st.n_gqa >= 4) type = GGMLType::Q5_K;
        else if (mix.more_bits_k && use_more_bits(st.i_attn_v, st.n_attn_v)) type = GGMLType::Q6_K;
        // an 8-expert model's attention is a small part of it: its values (and keys) get Q8_0
        if (st.n_expert == 8) type = GGMLType::Q8_0;
        ++st.i_attn_v;
    } else if (c == Category::attn_k) {
        if (st.n_expert == 8) type = GGMLType::Q8_0;
        else if (k == LowKMix::iq3_xxs) type = GGMLType::IQ2_S;
    } else if (c == Category::attn_q) {
        if (k == LowKMix::iq3_xxs) type = GGMLType::IQ2_S;
    } else if (c == Category::ffn_down) {
        // A mixture's experts are not consecutive tensors: its layer is the one the name gives.
        int i = st.i_ffn_down;
        const int n = st.n_ffn_down;
        if (st.n_expert > 1 && std::sscanf(t.name.c_str(), "blk.%d.", &i) != 1)
            fail("tensor '", t.name, "': an expert model's ffn_down tensors must be named blk.N.*");
        if (k == LowKMix::q2_k) type = GGMLType::Q3_K;
        else if (k == LowKMix::iq3_xxs && !st.has_imatrix) type = i < n / 8 ? GGMLType::Q4_K : GGMLType::Q3_K;
        else if (k == LowKMix::q3_k_m) type = i < n / 16 ? GGMLType::Q5_K : GGMLType::Q4_K;
        else if (k == LowKMix::iq3_m && (i < n / 8 || (st.n_expert == 8 && use_more_bits(i, n)))) type = GGMLType::Q4_K;
        else if (k == LowKMix::q3_k_l) type = GGMLType::Q5_K;
        else if (mix.more_bits_k && use_more_bits(i, n)) type = GGMLType::Q6_K;
        else if (i < n / 8 && k == LowKMix::iq4 && !st.has_imatrix) type = GGMLType::Q5_K;
        else if ((mix.base == GGMLType::Q4_0 || mix.base == GGMLType::Q5_0) && st.has_imatrix && i < n / 8)
            type = mix.base == GGMLType::Q4_0 ? GGMLType::Q4_1 : GGMLType::Q5_1;
        ++st.i_ffn_down;
    } else if (c == Category::attn_output) {
        if (st.n_expert == 8) {
            if (attn_output_q5_k_with_8_experts(mix)) type = GGMLType::Q5_K;
        } else if (k == LowKMix::q2_k) {
            type = GGMLType::Q3_K;
        } else if (k == LowKMix::iq3_xxs) {
            type = GGMLType::IQ3_S;
        } else if (k == LowKMix::q3_k_m || k == LowKMix::iq3_m) {
            type = GGMLType::Q4_K;
        } else if (k == LowKMix::q3_k_l) {
            type = GGMLType::Q5_K;
        }
    }
    return type;
}

}  // namespace

bool is_quantizable(const GGUFTensor& t) {
    const std::string& n = t.name;
    // Vectors, norms, routers (ffn_gate_inp, not the shared expert's ffn_gate_inp_shexp), the small conv1d kernels
    // of Mamba-style and LFM2 layers and a few other small or positional tables stay as they are.
    if (n_dims(t) < 2 || !ends_with(n, "weight")) return false;
    for (const char* part : {"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                             "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                             "indexer.q_proj.weight", "attn_rel_b.weight", ".position_embd", ".patch_embd", ".rel_pos"})
        if (contains(n, part)) return false;
    return n != "position_embd.weight" && n != "token_types.weight";
}

GGMLType choose_type(const QuantMix& mix, const GGUFTensor& t, RecipeState& st) {
    if (!is_quantizable(t)) return t.type;
    if (mix.base == GGMLType::F32 || mix.base == GGMLType::F16 || mix.base == GGMLType::BF16) return mix.base;
    GGMLType type = recipe_type(mix, t, category(t.name), st);
    if (is_k_type(type) && t.ne[0] % 256 != 0) type = k_fallback(type);
    const TypeTraits& tr = type_traits(type);
    if (t.ne[0] % tr.block_elems != 0) type = GGMLType::F16;   // rows too short for any block: keep precision
    return type;
}

bool counts_as_attn_v(const std::string& name) { return is_attn_v_like(category(name)); }

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

std::optional<GGMLType> override_type(const TypeOverrides& ov, const GGUFTensor& t, bool has_output) {
    // As llama-quantize: only the weight matrices the recipe may quantize are overridden; the token embedding's
    // type first (a per-layer table named by a pattern excepted), then the output head's, then the first matching
    // pattern, and for a tied embedding without a matching pattern the output head's type.
    if (!is_quantizable(t)) return std::nullopt;
    const Category c = category(t.name);
    auto first_match = [&]() -> std::optional<size_t> {
        for (size_t i = 0; i < ov.tensor_types.size(); ++i)
            if (std::regex_search(t.name, ov.tensor_types[i].first)) return i;
        return std::nullopt;
    };
    const std::optional<size_t> match = first_match();
    std::optional<GGMLType> type;
    std::string why;
    if (ov.token_embd && c == Category::token_embd && !(t.name == "per_layer_token_embd.weight" && match)) {
        type = *ov.token_embd;
        why = "--token-embedding-type";
    } else if (ov.output && c == Category::output) {
        type = *ov.output;
        why = "--output-tensor-type";
    } else if (match) {
        type = ov.tensor_types[*match].second;
        why = "--tensor-type '" + ov.patterns[*match] + "'";
    } else if (ov.output && !has_output && c == Category::token_embd) {
        type = *ov.output;
        why = "--output-tensor-type";
    }
    if (!type) return std::nullopt;
    if (is_k_type(*type) && t.ne[0] % 256 != 0) type = k_fallback(*type);
    const TypeTraits& tr = type_traits(*type);
    if (t.ne[0] % tr.block_elems != 0)
        fail(why, ": tensor '", t.name, "' has rows of ", t.ne[0], " elements, not a multiple of ", tr.name,
             "'s blocks of ", tr.block_elems, " (K types fall back as the recipe does: Q4_K -> Q5_0, Q5_K -> Q5_1, ",
             "Q6_K -> Q8_0; choose a type whose blocks divide the rows, or F16)");
    return type;
}

}  // namespace ember
