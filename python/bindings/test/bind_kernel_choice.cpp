// The CUDA backend's kernel choices (cuda/kernel_choice.h) for tests/test_kernel_choice.py: which
// matmul and attention kernel a query gets, and the thresholds they compare against. Pure C++, so
// it answers in the CPU build too. Switches start from their fallbacks (not the environment) and
// take the test's overrides through the switch table, which checks names and values.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <string>
#include <vector>

#include "backend/switches.h"
#include "ember/quant.h"
#include "ember/status.h"
#include "kernel_choice.h"

namespace nb = nanobind;
using namespace ember;
using namespace ember::cuda;

namespace {

using SwitchMap = std::map<std::string, std::string>;

GGMLType type_named(const std::string& name) {
    for (uint32_t id = 0; id < 64; ++id)
        if (const TypeTraits* t = find_type_traits(id); t && name == t->name) return t->type;
    fail("unknown tensor type '", name, "'");
}

KernelSwitches switches_of(const SwitchMap& overrides) {
    Switches s = Switches::current();
    for (const SwitchInfo& r : switch_table()) s = s.with(r.name, "");
    for (const auto& [name, value] : overrides) s = s.with(name, value);
    return kernel_switches(s);
}

MatmulQuery matmul_query(const std::string& type, int64_t n_in, int32_t n_tok, bool decode_step, bool deterministic,
                         const SwitchMap& switches, int cc, bool sm90a_build) {
    MatmulQuery q;
    q.type = type_named(type);
    q.n_in = n_in;
    q.batch = BatchFacts{n_tok, decode_step, deterministic};
    q.sw = switches_of(switches);
    q.dev = DeviceCaps{cc, sm90a_build};
    return q;
}

nb::dict attention(const std::string& k_type, const std::string& v_type, int32_t head_dim, int32_t n_head,
                   int32_t n_head_kv, int32_t block_size, int32_t max_len, int32_t window, int32_t n_tok,
                   bool decode_step, bool deterministic, bool fast_attention, const SwitchMap& switches, int cc) {
    AttentionQuery q;
    q.k_type = type_named(k_type);
    q.v_type = type_named(v_type);
    q.head_dim = head_dim;
    q.n_head = n_head;
    q.n_head_kv = n_head_kv;
    q.block_size = block_size;
    q.max_len = max_len;
    q.window = window;
    q.batch = BatchFacts{n_tok, decode_step, deterministic};
    q.fast_attention = fast_attention;
    q.sw = switches_of(switches);
    q.dev = DeviceCaps{cc, true};
    const AttentionChoice c = choose_attention(q);
    nb::dict d;
    d["kernel"] = attention_kernel_name(c.kernel);
    d["expand_q8"] = c.expand_q8;
    d["tile_len"] = kTileLens[c.tile_index];
    d["n_split"] = c.n_split;
    d["heads_per_cta"] = c.heads_per_cta;
    d["starts_early"] = attention_starts_early(q);
    return d;
}

nb::dict thresholds() {
    nb::dict d;
    d["max_gemv_tokens"] = kMaxGemvTokens;
    d["max_int_prompt_tokens"] = kMaxIntPromptTokens;
    d["max_gemm_q8_tokens"] = kMaxGemmQ8Tokens;
    d["max_gemm_dq_tokens"] = kMaxGemmDqTokens;
    d["max_graph_decode_tokens"] = kMaxGraphDecodeTokens;
    d["superblock_chunk_tokens"] = kSuperblockChunkTokens;
    d["legacy_exact_max_width"] = kLegacyExactMaxWidth;
    d["gemm_dq_align"] = kGemmDqAlign;
    d["exact_max_len"] = kExactMaxLen;
    d["short_max_len"] = kShortMaxLen;
    d["short_keys_per_cta"] = kShortKeysPerCta;
    d["keys_per_split"] = kKeysPerSplit;
    d["target_attn_ctas"] = kTargetAttnCtas;
    d["decode_target_ctas"] = kDecodeTargetCtas;
    d["decode_mma_target_ctas"] = kDecodeMmaTargetCtas;
    d["moe_pair_tokens"] = kMoePairTokens;
    d["moe_max_experts"] = kMoeMaxExperts;
    return d;
}

std::vector<std::string> weight_types() {
    std::vector<std::string> out;
    for (uint32_t id = 0; id < 64; ++id)
        if (const TypeTraits* t = find_type_traits(id); t && cuda_weight_type(t->type)) out.push_back(t->name);
    return out;
}

}  // namespace

void bind_kernel_choice(nb::module_& m) {
    m.def(
        "kernel_choice_matmul",
        [](const std::string& type, int64_t n_in, int32_t n_tok, bool decode_step, bool deterministic,
           const SwitchMap& switches, int cc, bool sm90a_build) {
            const MatmulQuery q = matmul_query(type, n_in, n_tok, decode_step, deterministic, switches, cc,
                                               sm90a_build);
            nb::dict d;
            d["kernel"] = matmul_kernel_name(choose_matmul(q));
            d["reads_q8"] = matmul_reads_q8(q);
            return d;
        },
        nb::arg("type"), nb::arg("n_in"), nb::arg("n_tok"), nb::arg("decode_step") = false,
        nb::arg("deterministic") = false, nb::arg("switches") = SwitchMap{}, nb::arg("cc") = 90,
        nb::arg("sm90a_build") = true,
        "The CUDA backend's kernel for a matmul by a weight of `type` with rows of n_in over n_tok tokens: "
        "{kernel, reads_q8}. decode_step: the tokens are an engine decode step (one a sequence).");
    m.def("kernel_choice_attention", &attention, nb::arg("k_type") = "F16", nb::arg("v_type") = "F16",
          nb::arg("head_dim") = 128, nb::arg("n_head") = 32, nb::arg("n_head_kv") = 8, nb::arg("block_size") = 16,
          nb::arg("max_len") = 1, nb::arg("window") = 0, nb::arg("n_tok") = 1, nb::arg("decode_step") = false,
          nb::arg("deterministic") = false, nb::arg("fast_attention") = false, nb::arg("switches") = SwitchMap{},
          nb::arg("cc") = 90,
          "The CUDA backend's attention kernel for a query: {kernel, expand_q8, tile_len, n_split, heads_per_cta, "
          "starts_early}.");
    m.def(
        "kernel_choice_ffn_swiglu",
        [](bool silu, const std::string& gate, const std::string& up, int32_t n_tok, bool deterministic) {
            return ffn_takes_gemv_swiglu(silu, type_named(gate), type_named(up),
                                         BatchFacts{n_tok, false, deterministic});
        },
        nb::arg("silu"), nb::arg("gate"), nb::arg("up"), nb::arg("n_tok"), nb::arg("deterministic") = false);
    m.def(
        "kernel_choice_graphed",
        [](int32_t n_tok, bool decode_step, const SwitchMap& switches) {
            return step_is_graphed(BatchFacts{n_tok, decode_step, false}, switches_of(switches));
        },
        nb::arg("n_tok"), nb::arg("decode_step") = false, nb::arg("switches") = SwitchMap{},
        "Whether a step of n_tok tokens is recorded as a CUDA graph.");
    m.def(
        "kernel_choice_moe",
        [](const std::string& gate, const std::string& up, const std::string& down, int64_t n_embd, int64_t n_ff,
           int32_t n_expert, int32_t n_used, int32_t n_tok, bool decode_step, bool deterministic,
           const SwitchMap& switches) {
            MoeQuery q;
            q.gate = type_named(gate);
            q.up = type_named(up);
            q.down = type_named(down);
            q.n_embd = n_embd;
            q.n_ff = n_ff;
            q.n_expert = n_expert;
            q.n_used = n_used;
            q.batch = BatchFacts{n_tok, decode_step, deterministic};
            q.sw = switches_of(switches);
            return std::string(moe_kernel_name(choose_moe(q)));
        },
        nb::arg("gate"), nb::arg("up"), nb::arg("down"), nb::arg("n_embd"), nb::arg("n_ff"), nb::arg("n_expert"),
        nb::arg("n_used"), nb::arg("n_tok"), nb::arg("decode_step") = false, nb::arg("deterministic") = false,
        nb::arg("switches") = SwitchMap{},
        "The CUDA backend's path for a mixture's experts over n_tok tokens: pairs, grouped or composed.");
    m.def("kernel_choice_splits", &attention_splits, nb::arg("want"), nb::arg("base"), nb::arg("target"));
    m.def("kernel_choice_want_splits", &attention_want_splits, nb::arg("max_len"), nb::arg("window") = 0);
    m.def("kernel_choice_thresholds", &thresholds);
    m.def("kernel_choice_weight_types", &weight_types, "The tensor types the CUDA backend runs as weights.");
}
