// The table of runtime switches (adding one is a row here plus the code that reads it) and the
// snapshot that resolves each: set_switch override, else the environment, else the fallback.
#include "backend/switches.h"

#include <cstdlib>
#include <mutex>

#include "ember/status.h"

namespace ember {

const std::vector<SwitchInfo>& switch_table() {
    static const std::vector<SwitchInfo> rows = {
        // CPU backend
        {"EMBER_SIMD", "", "scalar|avx2|avx512|neon",
         "Lowers the CPU kernels' SIMD level below the best the CPU supports: to scalar, or on x86 to a lower "
         "x86 level (a level the CPU lacks is ignored). Unset: the CPU's best. For comparing the kernel "
         "paths on one machine."},
        {"EMBER_CPU_FAST_GEMM", "1", "0|1",
         "0: the CPU matmuls never take the fast batched kernels (whose sums differ from vec_dot's in the "
         "last bits): every batch keeps vec_dot's exact tiles. A/B comparisons and diagnosis."},
        {"EMBER_CPU_HANDOUT_KB", "256", "integer",
         "The constant k (KiB) that sizes a CPU decode matmul's hand-outs of rows to threads (about "
         "threads x sqrt(weight bytes / k) chunks); 0 hands out the fixed chunk count only. Diagnosis."},
        // The model layer: a context with layers on both the CPU and the GPU
        {"EMBER_STREAM", "1", "0|1",
         "0: the CPU-resident layers of a partly offloaded model, and the CPU experts of GPU layers, stay on "
         "the CPU for every batch, instead of large batches streaming their weights to the GPU. Read when a "
         "context is created. Diagnosis and comparisons."},
        {"EMBER_STREAM_PIN", "1", "0|1",
         "0: streamed weights are copied through pinned bounce buffers even where the mapped file could be "
         "pinned for direct copies (tests the bounce buffers)."},
        // CUDA backend
        {"EMBER_CUDA_GRAPHS", "1", "0|1",
         "0: every step runs eagerly, never captured into or replayed from a CUDA graph."},
        {"EMBER_CUDA_GRAPH_LOG", "0", "0|1",
         "1: each step's graph outcome (replay, capture, eager) and each invalidation go to stderr: why a step "
         "shape does not replay."},
        {"EMBER_CUDA_FUSE", "1", "0|1",
         "0: every fused op (and matmul_many) takes the Backend's default composition of primitives, one "
         "launch per primitive."},
        {"EMBER_CUDA_PDL", "1", "0|1", "0: no programmatic dependent launch on Hopper."},
        {"EMBER_CUDA_EXACT_ATTN", "1", "0|1",
         "0: short contexts take the flash-decoding attention kernels too, instead of the kernel that keeps "
         "the CPU's order of sums."},
        {"EMBER_CUDA_EXACT_CLUSTER", "1", "0|1",
         "0: the short contexts' reference-order attention kernel runs one CTA per head, as on GPUs before "
         "Hopper, instead of a thread-block cluster."},
        {"EMBER_CUDA_SHORT_ATTN", "0", "0|1",
         "1: the engine's default-mode decode steps over short f16 contexts take attention_short (faster, but "
         "further from Llama's greedy text)."},
        {"EMBER_CUDA_GEMM_Q8", "1", "0|1",
         "0: batches that would take the int8 GEMM (gemm_q8) take the chunked GEMV instead (A/B comparisons)."},
        {"EMBER_CUDA_GEMM_DQ", "1", "0|1",
         "0: no gemm_dq (the f16 GEMM on weights dequantized in registers): batches take the paths it "
         "replaced (A/B comparisons)."},
        {"EMBER_CUDA_GEMM_DQ_WGMMA", "1", "0|1",
         "0: gemm_dq's mma.sync form on Hopper too, as GPUs before it run (A/B comparisons and its tests)."},
        {"EMBER_CUDA_GEMM_KQ", "0", "0|1",
         "1: batches of 9..64 tokens on Q4_K and Q6_K weights take gemm_dq (the f16 GEMM on weights "
         "dequantized in registers) instead of the GEMV in chunks of 8 tokens (opt-in until measured on a GPU)."},
        {"EMBER_CUDA_GEMM_DQ_ROWS", "0", "0|192|256",
         "192 or 256 fixes the row tile of gemm_dq's wgmma form; 0 picks the cheaper grid per launch."},
    };
    return rows;
}

namespace {

std::string known_names() {
    std::string s;
    for (const SwitchInfo& r : switch_table()) s += (s.empty() ? "" : ", ") + std::string(r.name);
    return s;
}

bool is_integer(const std::string& v) {
    if (v.empty() || v.size() > 18) return false;
    for (char c : v)
        if (c < '0' || c > '9') return false;
    return true;
}

// "0|1" -> "0 or 1"; "a|b|c" -> "a, b or c".
std::string spoken(const std::string& values) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t bar; (bar = values.find('|', start)) != std::string::npos; start = bar + 1)
        parts.push_back(values.substr(start, bar - start));
    parts.push_back(values.substr(start));
    std::string s;
    for (size_t i = 0; i < parts.size(); ++i) s += (i == 0 ? "" : i + 1 == parts.size() ? " or " : ", ") + parts[i];
    return s;
}

bool allowed(const SwitchInfo& info, const std::string& v) {
    if (v == info.fallback) return true;
    const std::string values = info.values;
    if (values == "integer") return is_integer(v);
    return ("|" + values + "|").find("|" + v + "|") != std::string::npos;
}

void check_value(const SwitchInfo& info, const std::string& v, const char* from) {
    if (allowed(info, v)) return;
    if (std::string(info.values) == "integer")
        fail(info.name, " must be a whole number >= 0 (got '", v, "'", from, ")");
    fail(info.name, " must be ", spoken(info.values), " (got '", v, "'", from, ")");
}

struct Overrides {
    std::mutex mu;
    std::map<std::string, std::string> values;
};
Overrides& overrides() {
    static Overrides o;
    return o;
}

}  // namespace

const SwitchInfo& switch_info(const std::string& name) {
    for (const SwitchInfo& r : switch_table())
        if (name == r.name) return r;
    fail("unknown switch '", name, "' (known: ", known_names(), ")");
}

Switches::Switches() {
    for (const SwitchInfo& r : switch_table()) values_[r.name] = r.fallback;
}

Switches Switches::current() {
    Overrides& o = overrides();
    std::lock_guard<std::mutex> lock(o.mu);
    Switches s;
    for (const SwitchInfo& r : switch_table()) {
        const auto it = o.values.find(r.name);
        const char* env = std::getenv(r.name);
        if (it != o.values.end()) {
            s.values_[r.name] = it->second;
        } else if (env && *env) {
            check_value(r, env, " from the environment");
            s.values_[r.name] = env;
        }
    }
    return s;
}

const std::string& Switches::get(const std::string& name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) switch_info(name);   // throws for an unknown name: every known one is in values_
    return it->second;
}

bool Switches::on(const std::string& name) const {
    const std::string& v = get(name);
    if (v == "1") return true;
    if (v == "0") return false;
    fail(name, " is '", v, "', not a 0/1 switch value");
}

long Switches::integer(const std::string& name) const {
    const std::string& v = get(name);
    if (!is_integer(v)) fail(name, " is '", v, "', not a whole number");
    return std::atol(v.c_str());
}

Switches Switches::with(const std::string& name, const std::string& value) const {
    const SwitchInfo& info = switch_info(name);
    check_value(info, value.empty() ? info.fallback : value, "");
    Switches s = *this;
    s.values_[name] = value.empty() ? info.fallback : value;
    return s;
}

void set_switch(const std::string& name, const std::string& value) {
    const SwitchInfo& info = switch_info(name);
    if (!value.empty()) check_value(info, value, "");
    Overrides& o = overrides();
    std::lock_guard<std::mutex> lock(o.mu);
    if (value.empty()) o.values.erase(name);
    else o.values[name] = value;
}

std::string switch_override(const std::string& name) {
    switch_info(name);
    Overrides& o = overrides();
    std::lock_guard<std::mutex> lock(o.mu);
    const auto it = o.values.find(name);
    return it == o.values.end() ? std::string() : it->second;
}

}  // namespace ember
