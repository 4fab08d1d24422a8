// Model quantizer (ember-quantize): GGUF in -> GGUF out, tensor by tensor, multi-threaded.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ember {

struct QuantizeParams {
    std::string input, output;
    // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q6_K, Q4_K / Q5_K (every matrix in that type, unlike llama-quantize
    // where they alias the mixes), the mixes Q4_K_M Q5_K_M Q2_K Q3_K_S Q3_K_M Q3_K_L IQ4_XS IQ3_S IQ3_M IQ3_XXS
    // IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ1_S IQ1_M (llama.cpp recipes; IQ3_XXS, IQ2 and IQ1 need an imatrix), MXFP4_MOE (expert tensors MXFP4, the other matrices Q8_0, as llama-quantize),
    // F16 BF16 F32.
    std::string type;
    int n_threads = 0;             // 0: all hardware threads
    bool allow_requantize = false; // quantizing an already-quantized file loses precision twice
    // Shards as llama-gguf-split writes them (either limit, 0 = none): OUTPUT without its .gguf is
    // the prefix of OUTPUT-00001-of-0000N.gguf, ...; a model that fits one shard is written to OUTPUT.
    uint64_t split_max_bytes = 0;
    uint64_t split_max_tensors = 0;
    // Per-tensor types over the recipe's, as llama-quantize's options: "REGEX=TYPE" (the last pattern
    // found in a tensor's name wins), the output head's type and the token embedding's ("" = the recipe's).
    std::vector<std::string> tensor_types;
    std::string output_tensor_type, token_embedding_type;
    // --imatrix: per weight name, an importance per column (the importance matrix's mean squared
    // activations; a stacked expert tensor's: each expert's columns in turn); Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    // IQ4_XS, IQ4_NL, IQ3_XXS, IQ3_S, IQ2 and IQ1 tensors named here are quantized weighted by them, as llama-quantize
    // does.
    std::map<std::string, std::vector<float>> imatrix;
    // Where the importances came from, recorded as llama-quantize records them when imatrix is not empty
    // (quantize.imatrix.file, .dataset, .entries_count, .chunks_count): the file as given ("": not written), its
    // first dataset ("": none) and the chunks it was computed on (0: not written).
    std::string imatrix_file, imatrix_dataset;
    uint32_t imatrix_chunks = 0;
};

// Progress callback: (tensor index, tensor count, tensor name, chosen type name).
using QuantizeProgress = std::function<void(int, int, const std::string&, const char*)>;

// Throws InvalidInput naming the file / tensor / type that is wrong. Returns the files written.
std::vector<std::string> quantize_model(const QuantizeParams& params, const QuantizeProgress& progress = nullptr);

}  // namespace ember
