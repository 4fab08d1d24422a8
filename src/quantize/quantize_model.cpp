// ember-quantize's engine: copies metadata, picks each tensor's type by the recipe, then streams
// tensors one at a time (dequantize rows to f32 -> quantize), rows split across threads.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/thread_pool.h"
#include "ember/quantize.h"
#include "ember/status.h"
#include "quant/kernels.h"
#include "quant/quant_weighted.h"
#include "quantize/recipe.h"

namespace ember {

namespace {

bool is_float_type(GGMLType t) { return t == GGMLType::F32 || t == GGMLType::F16 || t == GGMLType::BF16; }

GGUFValue int_value(GGUFType type, uint64_t v) {
    GGUFValue val;
    val.type = type;
    val.num.u = v;
    return val;
}

GGUFValue uint32_value(uint32_t v) { return int_value(GGUFType::UINT32, v); }

GGUFValue string_value(const std::string& s) {
    GGUFValue val;
    val.type = GGUFType::STRING;
    val.str = s;
    return val;
}

// What llama-quantize records of its importance matrix, in its order (after the input's keys): the file as given and
// its first dataset, each cut to 127 bytes as its key overrides hold them, the entries read, the chunks.
std::vector<std::pair<std::string, GGUFValue>> imatrix_keys(const QuantizeParams& p) {
    std::vector<std::pair<std::string, GGUFValue>> kv;
    if (p.imatrix.empty()) return kv;
    if (!p.imatrix_file.empty()) kv.emplace_back("quantize.imatrix.file", string_value(p.imatrix_file.substr(0, 127)));
    if (!p.imatrix_dataset.empty())
        kv.emplace_back("quantize.imatrix.dataset", string_value(p.imatrix_dataset.substr(0, 127)));
    kv.emplace_back("quantize.imatrix.entries_count", uint32_value(uint32_t(p.imatrix.size())));
    if (p.imatrix_chunks > 0) kv.emplace_back("quantize.imatrix.chunks_count", uint32_value(p.imatrix_chunks));
    return kv;
}

// The quantizer weighting by an importance matrix for type t; nullptr where the type has none.
QuantizeRowWeightedFn weighted_for(GGMLType t) {
    switch (t) {
        case GGMLType::Q2_K: return quantize_q2_k_weighted;
        case GGMLType::Q3_K: return quantize_q3_k_weighted;
        case GGMLType::IQ4_XS: return quantize_iq4_xs_weighted;
        case GGMLType::IQ4_NL: return quantize_iq4_nl_weighted;
        case GGMLType::IQ3_XXS: return quantize_iq3_xxs_weighted;
        case GGMLType::IQ3_S: return quantize_iq3_s_weighted;
        case GGMLType::IQ2_XXS: return quantize_iq2_xxs_weighted;
        case GGMLType::IQ2_XS: return quantize_iq2_xs_weighted;
        case GGMLType::IQ2_S: return quantize_iq2_s_weighted;
        case GGMLType::IQ1_S: return quantize_iq1_s_weighted;
        case GGMLType::IQ1_M: return quantize_iq1_m_weighted;
        case GGMLType::Q4_0: return quantize_q4_0_weighted;
        case GGMLType::Q4_1: return quantize_q4_1_weighted;
        case GGMLType::Q5_0: return quantize_q5_0_weighted;
        case GGMLType::Q5_1: return quantize_q5_1_weighted;
        case GGMLType::Q4_K: return quantize_q4_k_weighted;
        case GGMLType::Q5_K: return quantize_q5_k_weighted;
        case GGMLType::Q6_K: return quantize_q6_k_weighted;
        default: return nullptr;
    }
}

// Converts one tensor: rows of n_in elements from src type to dst type; qw (null: none): the
// importance of each column, for the types with a weighted quantizer (a stacked expert tensor's: one
// row of importances per expert, each expert's rows quantized with its own).
std::vector<uint8_t> convert_tensor(const GGUFTensor& t, GGMLType dst, ThreadPool& pool, const std::vector<float>* qw) {
    const int64_t n_in = t.ne[0], n_rows = t.n_rows();
    const TypeTraits& from = type_traits(t.type);
    const TypeTraits& to = type_traits(dst);
    const QuantizeRowFn quantize = weight_quantizer(dst);
    if (!quantize && !(qw && needs_imatrix(dst))) fail("no quantizer for type ", to.name, " (tensor '", t.name, "')");
    const size_t in_row = row_bytes(t.type, n_in), out_row = row_bytes(dst, n_in);
    std::vector<uint8_t> out(out_row * n_rows);
    const QuantizeRowWeightedFn weighted = qw ? weighted_for(dst) : nullptr;
    const int64_t rows_per_matrix = t.ne.size() > 2 ? t.ne[1] : n_rows;
    pool.parallel_for(n_rows, std::max<int64_t>(1, 65536 / n_in), [&](int64_t b, int64_t e) {
        std::vector<float> row(n_in);
        for (int64_t r = b; r < e; ++r) {
            from.dequantize_row(t.data + r * in_row, row.data(), n_in);
            if (weighted) weighted(row.data(), out.data() + r * out_row, n_in, qw->data() + r / rows_per_matrix * n_in);
            else quantize(row.data(), out.data() + r * out_row, n_in);
        }
    });
    return out;
}

// One writer per shard of the plan; the first shard carries the metadata, every shard the split keys.
std::vector<std::unique_ptr<GGUFWriter>> open_writers(const QuantizeParams& params, uint32_t file_type,
                                                      const GGUFFile& in, const std::vector<GGMLType>& types,
                                                      std::vector<std::string>& paths, std::vector<uint32_t>& plan) {
    const auto& ts = in.tensors();
    std::vector<size_t> nbytes(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) nbytes[i] = row_bytes(types[i], ts[i].ne[0]) * ts[i].n_rows();
    plan = gguf_split_plan(nbytes, params.split_max_bytes, params.split_max_tensors, in.alignment());
    const uint32_t n_split = plan.empty() ? 1 : plan.back() + 1;
    if (n_split > 99999) fail(params.output, ": the split limits make ", n_split, " shards, more than 99999");
    std::string prefix = params.output;
    if (prefix.size() > 5 && prefix.compare(prefix.size() - 5, 5, ".gguf") == 0) prefix.resize(prefix.size() - 5);
    std::vector<std::unique_ptr<GGUFWriter>> out;
    for (uint32_t k = 0; k < n_split; ++k) {
        paths.push_back(n_split == 1 ? params.output : gguf_split_path(prefix, k, n_split));
        if (paths.back() == in.path()) fail("output file must differ from the input file '", in.path(), "'");
        out.push_back(std::make_unique<GGUFWriter>(paths.back(), in.alignment()));
        GGUFWriter& w = *out.back();
        const auto recorded = imatrix_keys(params);
        // keys written anew move to the end, as llama-quantize's gguf_set_* move them
        auto rewritten = [&](const std::string& key) {
            return key == "general.file_type" || key == "general.quantization_version" || key.rfind("split.", 0) == 0 ||
                   std::any_of(recorded.begin(), recorded.end(), [&](const auto& kv) { return kv.first == key; });
        };
        if (k == 0)
            for (const auto& [key, value] : in.metadata())
                if (!rewritten(key)) w.set(key, value);
        if (k == 0) {
            w.set("general.quantization_version", uint32_value(2));   // in llama-quantize's order
            w.set("general.file_type", uint32_value(file_type));
            for (const auto& [key, value] : recorded) w.set(key, value);
        }
        if (n_split > 1) {
            w.set(kSplitNo, int_value(GGUFType::UINT16, k));   // in llama-gguf-split's order
            w.set(kSplitTensorsCount, int_value(GGUFType::INT32, ts.size()));
            w.set(kSplitCount, int_value(GGUFType::UINT16, n_split));
        }
    }
    for (size_t i = 0; i < ts.size(); ++i) out[plan[i]]->add_tensor_info(ts[i].name, types[i], ts[i].ne);
    for (auto& w : out) w->write_header();
    return out;
}

}  // namespace

std::vector<std::string> quantize_model(const QuantizeParams& params, const QuantizeProgress& progress) {
    const QuantMix* mix = find_quant_mix(params.type);
    if (!mix) fail("unknown quantization type '", params.type, "'; choose one of: ", quant_mix_names());
    if (params.input == params.output) fail("output file must differ from the input file '", params.input, "'");
    GGUFFile in(params.input);
    if (!params.allow_requantize)
        for (const auto& t : in.tensors())
            if (!is_float_type(t.type))
                fail(params.input, ": tensor '", t.name, "' is already quantized (", type_traits(t.type).name,
                     "); requantizing loses precision twice, pass --allow-requantize to do it anyway");

    RecipeState st;
    st.has_imatrix = !params.imatrix.empty();
    // As llama.cpp's hparams: layer 0's query heads per KV head (a per-layer array's first entry; 0 where layer 0
    // has no attention), the expert count and block_count.
    const std::string arch = in.get_string("general.architecture", "");
    auto first = [&](const std::string& key) -> std::optional<uint64_t> {
        const GGUFValue* v = in.find(arch + "." + key);
        if (v && v->type == GGUFType::ARRAY && !v->arr.empty() && v->arr[0].is_integer()) return v->arr[0].num.u;
        if (v && v->is_integer()) return v->num.u;
        return std::nullopt;
    };
    const auto heads = first("attention.head_count"), kv_heads = first("attention.head_count_kv");
    if (heads) st.n_gqa = kv_heads ? (*kv_heads == 0 ? 0 : int(*heads / *kv_heads)) : 1;
    st.n_expert = int(first("expert_count").value_or(0));
    int max_layer = -1;
    for (const auto& t : in.tensors()) {
        if (t.name == "output.weight") st.has_output = true;
        if (counts_as_attn_v(t.name)) ++st.n_attn_v;
        int il = -1;
        if (std::sscanf(t.name.c_str(), "blk.%d.", &il) == 1) max_layer = std::max(max_layer, il);
    }
    st.n_ffn_down = int(first("block_count").value_or(uint64_t(max_layer + 1)));
    // The recipe's running attn_v / ffn_down counters advance in llama.cpp's order (layer number,
    // then name), not file order: files with blk.0, blk.1, blk.10, ... order would shift the
    // more-bits layers otherwise.
    const auto& ts = in.tensors();
    std::vector<size_t> order(ts.size());
    std::vector<int> layer(ts.size(), -1);
    for (size_t i = 0; i < ts.size(); ++i) {
        order[i] = i;
        std::sscanf(ts[i].name.c_str(), "blk.%d.", &layer[i]);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return layer[a] != layer[b] ? layer[a] < layer[b] : ts[a].name < ts[b].name;
    });
    const TypeOverrides ov = parse_type_overrides(params.tensor_types, params.output_tensor_type,
                                                  params.token_embedding_type);
    std::vector<GGMLType> types(ts.size());
    for (size_t i : order) {
        const std::optional<GGMLType> forced = override_type(ov, ts[i], st.has_output);
        types[i] = forced ? *forced : choose_type(*mix, ts[i], st);
    }
    // As llama-quantize: an entry holds a row of importances per matrix (per expert of a 3-D tensor); one of
    // another size is an error, except the token embedding's, which is quantized without it.
    std::map<std::string, std::vector<float>> imatrix = params.imatrix;
    for (const auto& t : ts)
        if (const auto it = imatrix.find(t.name); it != imatrix.end()) {
            const int64_t n_mat = t.ne.size() > 2 ? t.n_rows() / t.ne[1] : 1;
            if ((int64_t)it->second.size() == t.ne[0] * n_mat) continue;
            if (t.name == "token_embd.weight") {
                imatrix.erase(it);
                continue;
            }
            if (n_mat == 1)
                fail("--imatrix: the entry for '", t.name, "' has ", it->second.size(), " columns, but its rows have ",
                     t.ne[0], " elements: the importance matrix is of another model");
            fail("--imatrix: the entry for '", t.name, "' has ", it->second.size(), " values, but its ", n_mat,
                 " experts' rows have ", t.ne[0], " elements (", n_mat * t.ne[0],
                 " expected): the importance matrix is of another model");
        }

    // As llama-quantize: the lowest-bit types are refused without importances (their result would be garbage),
    // except on the token embedding and the output head, which it exempts.
    for (size_t i = 0; i < ts.size(); ++i) {
        const bool exempt = ts[i].name == "token_embd.weight" || ts[i].name == "output.weight";
        if (types[i] != ts[i].type && needs_imatrix(types[i]) && !imatrix.count(ts[i].name) &&
            !(exempt && weight_quantizer(types[i])))
            fail("tensor '", ts[i].name, "' in ", type_traits(types[i]).name, " needs an importance matrix: ",
                 imatrix.empty() ? "pass --imatrix FILE (ember-imatrix or llama-imatrix)"
                                 : "the --imatrix file has no entry for it",
                 ", as llama-quantize requires for its very low-bit types");
    }

    std::vector<std::string> paths;
    std::vector<uint32_t> plan;
    auto out = open_writers(params, mix->file_type, in, types, paths, plan);

    const int n_threads = params.n_threads > 0 ? params.n_threads
                                               : (int)std::max(1u, std::thread::hardware_concurrency());
    ThreadPool pool(n_threads);
    const int n = (int)in.tensors().size();
    for (int i = 0; i < n; ++i) {
        const GGUFTensor& t = in.tensors()[i];
        if (progress) progress(i, n, t.name, type_traits(types[i]).name);
        if (types[i] == t.type) {
            out[plan[i]]->write_tensor_data(t.data, t.nbytes);
        } else {
            const auto it = imatrix.find(t.name);
            const std::vector<uint8_t> data = convert_tensor(t, types[i], pool,
                                                             it == imatrix.end() ? nullptr : &it->second);
            out[plan[i]]->write_tensor_data(data.data(), data.size());
        }
    }
    for (auto& w : out) w->finish();
    return paths;
}

}  // namespace ember
