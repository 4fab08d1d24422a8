// general.architecture -> Architecture: one row per supported name.
#include <string>

#include "ember/status.h"
#include "model/arch/arch.h"

namespace ember {

const Architecture& llama_architecture();
const Architecture& qwen2_architecture();
const Architecture& qwen3_architecture();
const Architecture& gemma3_architecture();
const Architecture& qwen3moe_architecture();
const Architecture& gpt_oss_architecture();
const Architecture& bert_architecture();
const Architecture& nomic_bert_architecture();
const Architecture& nomic_bert_moe_architecture();
const Architecture& gemma_embedding_architecture();
const Architecture& phi3_architecture();
const Architecture& mistral3_architecture();
const Architecture& glm4_architecture();
const Architecture& command_r_architecture();
const Architecture& cohere2_architecture();
const Architecture& gemma2_architecture();
const Architecture& olmo2_architecture();
const Architecture& granite_architecture();
const Architecture& smollm3_architecture();
const Architecture& qwen35_architecture();
const Architecture& qwen35moe_architecture();
const Architecture& qwen3next_architecture();
const Architecture& gemma4_architecture();
const Architecture& llama4_architecture();
const Architecture& deepseek2_architecture();
const Architecture& lfm2_architecture();
const Architecture& lfm2moe_architecture();
const Architecture& nemotron_h_architecture();
const Architecture& nemotron_h_moe_architecture();
const Architecture& granite_hybrid_architecture();

namespace {
struct Entry {
    const char* name;
    const Architecture& (*get)();
};
const Entry kArchitectures[] = {
    {"llama", &llama_architecture},
    {"mistral", &llama_architecture},
    {"qwen2", &qwen2_architecture},
    {"qwen3", &qwen3_architecture},
    {"gemma3", &gemma3_architecture},
    {"qwen3moe", &qwen3moe_architecture},
    {"gpt-oss", &gpt_oss_architecture},
    {"bert", &bert_architecture},
    {"nomic-bert", &nomic_bert_architecture},
    {"nomic-bert-moe", &nomic_bert_moe_architecture},
    {"gemma-embedding", &gemma_embedding_architecture},
    {"phi3", &phi3_architecture},
    {"mistral3", &mistral3_architecture},
    {"glm4", &glm4_architecture},
    {"command-r", &command_r_architecture},
    {"cohere2", &cohere2_architecture},
    {"gemma2", &gemma2_architecture},
    {"olmo2", &olmo2_architecture},
    {"granite", &granite_architecture},
    {"smollm3", &smollm3_architecture},
    {"qwen35", &qwen35_architecture},
    {"qwen35moe", &qwen35moe_architecture},
    {"qwen3next", &qwen3next_architecture},
    {"gemma4", &gemma4_architecture},
    {"llama4", &llama4_architecture},
    {"deepseek2", &deepseek2_architecture},
    {"lfm2", &lfm2_architecture},
    {"lfm2moe", &lfm2moe_architecture},
    {"nemotron_h", &nemotron_h_architecture},
    {"nemotron_h_moe", &nemotron_h_moe_architecture},
    {"granitehybrid", &granite_hybrid_architecture},
};
}  // namespace

const Architecture& find_architecture(const std::string& name, const std::string& path) {
    std::string names;
    for (const Entry& e : kArchitectures) {
        if (name == e.name) return e.get();
        names += (names.empty() ? "" : ", ") + std::string(e.name);
    }
    fail(path, ": unsupported architecture '", name, "' (general.architecture); supported: ", names);
}

}  // namespace ember
