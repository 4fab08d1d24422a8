// Which type each tensor gets for a quantization mix (llama.cpp's recipe, so files compare).
#pragma once
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "ember/gguf.h"

namespace ember {

// The low-bit mixes' rules for attn_v, ffn_down, attn_output and attn_qkv (llama.cpp's).
enum class LowKMix : uint8_t {
    none,
    q2_k,
    q3_k_m,
    q3_k_l,
    iq4,   // IQ4_NL and IQ4_XS
    iq3_s,
    iq3_m,
    iq3_xxs,
    iq2_xxs,
    iq2_xs,
    iq2_s,
    iq2_m,
    iq1_s,
    iq1_m,
    tq   // TQ1_0 and TQ2_0: the token embedding in Q4_K
};

struct QuantMix {
    const char* name;       // as given on the command line
    GGMLType base;          // type of ordinary weight matrices
    uint32_t file_type;     // general.file_type value (llama_ftype)
    bool more_bits_k;       // *_K_M: some attn_v / ffn_down layers get Q6_K
    bool experts_mxfp4 = false;   // MXFP4_MOE: expert tensors MXFP4, the base type for the rest
    LowKMix low_k = LowKMix::none;
};

// nullptr if the name is unknown.
const QuantMix* find_quant_mix(const std::string& name);
// The quantizer llama-quantize writes type t's weights with when no importances are given; nullptr where
// ember has none.
QuantizeRowFn weight_quantizer(GGMLType t);
// The types llama-quantize refuses to write without an importance matrix (but on token_embd and output).
bool needs_imatrix(GGMLType t);
std::string quant_mix_names();

// Counts of attn_v-like tensors and ffn_down layers seen so far decide which layers get more bits.
struct RecipeState {
    int n_attn_v = 0;     // attn_v, attn_qkv and attn_kv_b tensors in the model (counts_as_attn_v)
    int n_ffn_down = 0;   // the model's block_count: layers without an FFN still count, as in llama.cpp
    int i_attn_v = 0, i_ffn_down = 0;   // running indices
    bool has_output = false;
    int n_gqa = 1;      // layer 0's query heads per KV head (0 where it has none); Q2_K's and IQ4_XS's attn_v rules
    int n_expert = 0;   // the mixture's experts (expert_count); 8 and >= 4 change some rules
    bool has_imatrix = false;
};

// Whether the recipe may change t's type: 2-D or 3-D weights, but norms, routers, conv1d kernels and the other
// small tensors llama-quantize keeps as they are.
bool is_quantizable(const GGUFTensor& t);
// attn_v, attn_qkv and attn_kv_b take attn_v's rules and are counted together.
bool counts_as_attn_v(const std::string& name);
// Type for tensor t under mix (in llama.cpp's tensor order: layer, then name); t's own type for tensors
// that are not quantizable.
GGMLType choose_type(const QuantMix& mix, const GGUFTensor& t, RecipeState& st);

// Per-tensor types chosen on the command line, over the recipe's choice (llama-quantize's
// --tensor-type, --output-tensor-type, --token-embedding-type).
struct TypeOverrides {
    std::vector<std::pair<std::regex, GGMLType>> tensor_types;   // the first matching pattern wins
    std::vector<std::string> patterns;                           // the source text of each regex, for errors
    std::optional<GGMLType> output, token_embd;
};

// A type a tensor can be written in, by name (any case); throws naming the types there are.
GGMLType parse_tensor_type(const std::string& name, const char* option);
// "REGEX=TYPE" strings and the two type names ("" = none); throws on a bad regex or type.
TypeOverrides parse_type_overrides(const std::vector<std::string>& tensor_types, const std::string& output_type,
                                   const std::string& token_embd_type);
// The type the overrides give t, in llama-quantize's order (--token-embedding-type, --output-tensor-type, the first
// matching --tensor-type, a tied embedding's --output-tensor-type), with the recipe's fallback where a K type's
// 256-element blocks do not fit the rows; nullopt where none applies (the recipe decides, and only then advances its
// counters, as llama-quantize's); throws where no fallback fits.
std::optional<GGMLType> override_type(const TypeOverrides& ov, const GGUFTensor& t, bool has_output);

}  // namespace ember
