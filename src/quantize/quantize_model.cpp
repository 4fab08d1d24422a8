// ember-quantize's engine: copies metadata, picks each tensor's type by the recipe, then streams
// tensors one at a time (dequantize rows to f32 -> quantize), rows split across threads.
#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "cpu/thread_pool.h"
#include "ember/quantize.h"
#include "ember/status.h"
#include "quantize/recipe.h"

namespace ember {

namespace {

bool is_float_type(GGMLType t) { return t == GGMLType::F32 || t == GGMLType::F16 || t == GGMLType::BF16; }

GGUFValue uint32_value(uint32_t v) {
    GGUFValue val;
    val.type = GGUFType::UINT32;
    val.num.u = v;
    return val;
}

// Converts one tensor: rows of n_in elements from src type to dst type.
std::vector<uint8_t> convert_tensor(const GGUFTensor& t, GGMLType dst, ThreadPool& pool) {
    const int64_t n_in = t.ne[0], n_rows = t.n_rows();
    const TypeTraits& from = type_traits(t.type);
    const TypeTraits& to = type_traits(dst);
    if (!to.quantize_row) fail("no quantizer for type ", to.name, " (tensor '", t.name, "')");
    const size_t in_row = row_bytes(t.type, n_in), out_row = row_bytes(dst, n_in);
    std::vector<uint8_t> out(out_row * n_rows);
    pool.parallel_for(n_rows, std::max<int64_t>(1, 65536 / n_in), [&](int64_t b, int64_t e) {
        std::vector<float> row(n_in);
        for (int64_t r = b; r < e; ++r) {
            from.dequantize_row(t.data + r * in_row, row.data(), n_in);
            to.quantize_row(row.data(), out.data() + r * out_row, n_in);
        }
    });
    return out;
}

}  // namespace

void quantize_model(const QuantizeParams& params, const QuantizeProgress& progress) {
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
    for (const auto& t : in.tensors()) {
        if (t.name == "output.weight") st.has_output = true;
        if (t.name.find("attn_v.weight") != std::string::npos) ++st.n_attn_v;
        if (t.name.find("ffn_down.weight") != std::string::npos) ++st.n_ffn_down;
    }
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
    std::vector<GGMLType> types(ts.size());
    for (size_t i : order) types[i] = choose_type(*mix, ts[i], st);

    GGUFWriter out(params.output, in.alignment());
    for (const auto& [key, value] : in.metadata())
        if (key != "general.file_type" && key != "general.quantization_version") out.set(key, value);
    out.set("general.file_type", uint32_value(mix->file_type));
    out.set("general.quantization_version", uint32_value(2));
    for (size_t i = 0; i < in.tensors().size(); ++i)
        out.add_tensor_info(in.tensors()[i].name, types[i], in.tensors()[i].ne);
    out.write_header();

    const int n_threads = params.n_threads > 0 ? params.n_threads
                                               : (int)std::max(1u, std::thread::hardware_concurrency());
    ThreadPool pool(n_threads);
    const int n = (int)in.tensors().size();
    for (int i = 0; i < n; ++i) {
        const GGUFTensor& t = in.tensors()[i];
        if (progress) progress(i, n, t.name, type_traits(types[i]).name);
        if (types[i] == t.type) {
            out.write_tensor_data(t.data, t.nbytes);
        } else {
            const std::vector<uint8_t> data = convert_tensor(t, types[i], pool);
            out.write_tensor_data(data.data(), data.size());
        }
    }
    out.finish();
}

}  // namespace ember
