// plan_placement: blocks, their experts and the head to devices, tensor by tensor.
#include "model/placement.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <optional>
#include <regex>

#include "ember/status.h"
#include "model/arch/arch.h"

namespace ember {

const char* device_name(Device d) { return d == Device::gpu ? "CUDA" : "CPU"; }

bool is_expert_tensor(const std::string& name) {
    return name.find("_exps") != std::string::npos || name.find("_chexps") != std::string::npos;
}

bool is_moe_tensor(const std::string& name) {
    return is_expert_tensor(name) || name.find("_shexp") != std::string::npos ||
           name.find("ffn_gate_inp") != std::string::npos || name.find("exp_probs_b") != std::string::npos;
}

bool PlacementPlan::any_experts_apart() const {
    for (size_t l = 0; l < block.size(); ++l)
        if (experts_apart((int32_t)l)) return true;
    return false;
}

namespace {

struct Override {
    std::string text;     // as given, for messages
    std::string option;   // the option it came from
    std::regex re;
    Device device;
};

// llama.cpp's buffer names as ember has them: CPU, and CUDA (or CUDA<main_gpu>, GPU) for the one GPU.
Device parse_device(const std::string& given, int32_t main_gpu, const std::string& option) {
    std::string d;
    for (char c : given) d += (char)std::tolower((unsigned char)c);
    if (d == "cpu") return Device::cpu;
    if (d == "cuda" || d == "gpu" || d == "cuda" + std::to_string(main_gpu)) return Device::gpu;
    if (d.size() > 4 && d.compare(0, 4, "cuda") == 0 &&
        std::all_of(d.begin() + 4, d.end(), [](char c) { return std::isdigit((unsigned char)c); }))
        fail(option, ": device '", given, "': ember drives one GPU, main_gpu ", main_gpu, " (CUDA or CUDA", main_gpu,
             ")");
    fail(option, ": unknown device '", given, "' (CPU or CUDA)");
}

std::regex compile(const std::string& pattern, const std::string& option) {
    try {
        return std::regex(pattern, std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
        fail(option, ": '", pattern, "' is not a valid regular expression (", e.what(), ")");
    }
}

// Every override in the order the first match is looked for: override_tensor's (each entry a
// comma-separated list, as llama.cpp's -ot takes it), then n_cpu_moe's, then cpu_moe's.
std::vector<Override> parse_overrides(const ModelParams& p, int32_t n_layer) {
    std::vector<Override> out;
    for (const std::string& entry : p.override_tensor) {
        size_t start = 0;
        while (start <= entry.size()) {
            const size_t comma = std::min(entry.find(',', start), entry.size());
            const std::string item = entry.substr(start, comma - start);
            start = comma + 1;
            // Device names hold no '=', so the last one splits: a pattern may contain '='.
            const size_t eq = item.rfind('=');
            if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
                fail("override_tensor: '", item, "' must be REGEX=DEVICE, e.g. exps=CPU");
            const std::string pattern = item.substr(0, eq);
            out.push_back({item, "override_tensor", compile(pattern, "override_tensor"),
                           parse_device(item.substr(eq + 1), p.main_gpu, "override_tensor")});
        }
    }
    if (p.n_cpu_moe < 0) fail("n_cpu_moe must be >= 0, got ", p.n_cpu_moe);
    if (p.n_cpu_moe > n_layer)
        fail("n_cpu_moe ", p.n_cpu_moe, " is more than the model's ", n_layer,
             " blocks (cpu_moe puts every block's experts on the CPU)");
    if (p.moe_gpu_budget_mb < -1)
        fail("moe_gpu_budget_mb must be -1 (off), 0 (what is free) or MiB, got ", p.moe_gpu_budget_mb);
    const std::string experts = "\\.ffn_[a-z_]*exps\\.";
    for (int32_t l = 0; l < p.n_cpu_moe; ++l) {
        const std::string pattern = "^blk\\." + std::to_string(l) + experts;
        out.push_back({pattern + "=CPU", "n_cpu_moe", compile(pattern, "n_cpu_moe"), Device::cpu});
    }
    if (p.cpu_moe) out.push_back({experts + "=CPU", "cpu_moe", compile(experts, "cpu_moe"), Device::cpu});
    return out;
}

const Override* first_match(const std::vector<Override>& ov, const std::string& name) {
    for (const Override& o : ov)
        if (std::regex_search(name, o.re)) return &o;
    return nullptr;
}

// Block index of "blk.N.<rest>", -1 for tensors outside the blocks.
int32_t block_of(const std::string& name, int32_t n_layer) {
    if (name.compare(0, 4, "blk.") != 0) return -1;
    const size_t dot = name.find('.', 4);
    if (dot == std::string::npos || dot == 4) return -1;
    int32_t l = 0;
    for (size_t i = 4; i < dot; ++i) {
        if (!std::isdigit((unsigned char)name[i])) return -1;
        l = l * 10 + (name[i] - '0');
        if (l >= n_layer) return -1;
    }
    return l;
}

// Where one group of tensors goes: every member's first matching override, else `fallback`; all
// must agree, `what` saying what the group is in the message.
struct Agreement {
    std::optional<Device> device;
    std::string first;   // the tensor that decided it
    const Override* by = nullptr;
    void add(const std::string& name, const Override* o, Device fallback, const char* what) {
        const Device d = o ? o->device : fallback;
        if (device && *device != d) {
            const std::string a = first + " on " + device_name(*device) + (by ? " (" + by->option + ")" : "");
            const std::string b = name + " on " + device_name(d) + (o ? " (" + o->option + ")" : "");
            fail("the tensor overrides put ", a, " but ", b, ": ", what);
        }
        if (!device || (o && !by)) first = name, by = o;
        device = d;
    }
};

std::string block_ranges(const std::vector<int32_t>& ls) {
    std::string out;
    for (size_t i = 0; i < ls.size();) {
        size_t j = i;
        while (j + 1 < ls.size() && ls[j + 1] == ls[j] + 1) ++j;
        out += (out.empty() ? "" : ", ") + std::to_string(ls[i]) + (j > i ? "-" + std::to_string(ls[j]) : "");
        i = j + 1;
    }
    return out;
}

std::string mib(size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
    return buf;
}

}  // namespace

PlacementPlan plan_placement(const GGUFFile& f, int32_t n_layer, const ModelParams& p, bool have_gpu,
                             size_t gpu_free_bytes) {
    std::vector<Override> ov = parse_overrides(p, n_layer);
    PlacementPlan plan;
    int32_t n_gpu = p.n_gpu_layers < 0 ? n_layer : std::min(p.n_gpu_layers, n_layer);
    if (!have_gpu) {
        const bool gpu_asked = std::any_of(ov.begin(), ov.end(),
                                           [](const Override& o) { return o.device == Device::gpu; });
        if (p.n_gpu_layers != 0 || gpu_asked)
            plan.warning = (p.n_gpu_layers != 0 ? "n_gpu_layers=" + std::to_string(p.n_gpu_layers)
                                                : "override_tensor") +
                           " ignored: this ember was built without CUDA, so all blocks run on the CPU "
                           "(rebuild with -Ccmake.define.EMBER_CUDA=ON to offload)";
        n_gpu = 0;
        for (Override& o : ov) o.device = Device::cpu;
    }
    std::vector<Device> by_ngl(n_layer, Device::cpu);
    for (int32_t l = n_layer - n_gpu; l < n_layer; ++l) by_ngl[l] = Device::gpu;

    // A block's own tensors move together; its routed experts decide where its MoE tensors go.
    std::vector<Agreement> block(n_layer), experts(n_layer);
    std::vector<size_t> moe_bytes(n_layer, 0);
    const std::vector<GGUFTensor>& all = f.tensors();
    for (const GGUFTensor& t : all) {
        const int32_t l = block_of(t.name, n_layer);
        if (l < 0) continue;
        if (is_moe_tensor(t.name)) moe_bytes[l] += t.nbytes;
        else
            block[l].add(t.name, first_match(ov, t.name), by_ngl[l],
                         "a block's attention, norms and dense tensors stay together (its experts may go elsewhere)");
    }
    plan.block.resize(n_layer);
    plan.experts.resize(n_layer);
    for (int32_t l = 0; l < n_layer; ++l) plan.block[l] = block[l].device.value_or(by_ngl[l]);
    for (const GGUFTensor& t : all) {
        const int32_t l = block_of(t.name, n_layer);
        if (l >= 0 && is_expert_tensor(t.name))
            experts[l].add(t.name, first_match(ov, t.name), plan.block[l], "a block's experts stay together");
    }
    for (int32_t l = 0; l < n_layer; ++l) {
        plan.experts[l] = experts[l].device.value_or(plan.block[l]);
        if (plan.experts[l] == Device::gpu && plan.block[l] == Device::cpu)
            fail("the tensor overrides put ", experts[l].first, " on CUDA (", experts[l].by->option,
                 ") but its block on the CPU: experts run on the GPU only with their block there (n_gpu_layers)");
    }
    plan.n_gpu_blocks = (int32_t)std::count(plan.block.begin(), plan.block.end(), Device::gpu);
    // What the architecture cannot run on the GPU is refused here, at load, rather than at its first step.
    const std::string arch_name = plan.any_gpu() ? f.get_string("general.architecture") : std::string();
    const Architecture* arch = plan.any_gpu() ? &find_architecture(arch_name, f.path()) : nullptr;
    const std::string cpu_only = arch ? arch->cpu_only(f) : std::string();
    if (!cpu_only.empty())
        fail(f.path(), ": ", arch_name, " cannot have blocks on the GPU: ", cpu_only, "; load it with n_gpu_layers=0",
             p.override_tensor.empty() ? "" : " and no tensor overrides to CUDA");
    const bool has_experts = std::any_of(moe_bytes.begin(), moe_bytes.end(), [](size_t b) { return b > 0; });
    const char* experts_stay = arch && has_experts ? arch->experts_stay_with_block() : nullptr;
    for (int32_t l = 0; l < n_layer && experts_stay; ++l)
        if (plan.experts_apart(l))
            fail(f.path(), ": ", arch_name, " cannot have a GPU block's experts on the CPU (", experts[l].first, " by ",
                 experts[l].by->option, "): ", experts_stay,
                 "; keep the experts with their blocks (no cpu_moe, n_cpu_moe or exps=CPU override) and choose "
                 "the blocks on the CPU with n_gpu_layers");

    Agreement head;
    for (const char* name : {"output.weight", "output_norm.weight"})
        if (f.find_tensor(name))
            head.add(name, first_match(ov, name), plan.any_gpu() ? Device::gpu : Device::cpu,
                     "the output head stays together");
    plan.head = head.device.value_or(plan.any_gpu() ? Device::gpu : Device::cpu);

    auto device_of = [&](const std::string& name) {
        const int32_t l = block_of(name, n_layer);
        if (l >= 0) return is_moe_tensor(name) ? plan.experts[l] : plan.block[l];
        if (name == "output.weight" || name == "output_norm.weight") return plan.head;
        return Device::cpu;   // token_embd (the runner reads its rows in host memory) and the like
    };
    size_t gpu_bytes = 0;
    for (const GGUFTensor& t : all)
        if (device_of(t.name) == Device::gpu) gpu_bytes += t.nbytes;

    // The budget keeps the experts of the last blocks, as -ngl keeps the last blocks: without
    // usage statistics, layer order stands in for how much each block's experts are used.
    std::string budget_note;
    const size_t margin = kGpuBudgetMarginMiB << 20;
    if (p.moe_gpu_budget_mb > 0) plan.gpu_budget = (size_t)p.moe_gpu_budget_mb << 20;
    else if (p.moe_gpu_budget_mb == 0 && gpu_free_bytes > 0 && gpu_bytes + margin > gpu_free_bytes)
        plan.gpu_budget = std::max(gpu_free_bytes, margin) - margin;
    if (!plan.any_gpu()) plan.gpu_budget.reset();
    if (plan.gpu_budget) {
        // Experts apart from their block take the staging of prompt batches on the GPU too: two
        // blocks' MoE matrices (remote_experts.h), so moving one block's experts alone saves nothing.
        size_t staging = 0;
        for (int32_t l = 0; l < n_layer; ++l)
            if (plan.experts_apart(l)) staging = std::max(staging, 2 * moe_bytes[l]);
        const size_t budget = *plan.gpu_budget;
        std::vector<int32_t> moved;
        for (int32_t l = 0; l < n_layer && gpu_bytes + staging > budget && !experts_stay; ++l)
            if (plan.experts[l] == Device::gpu && moe_bytes[l] > 0) {
                plan.experts[l] = Device::cpu;
                gpu_bytes -= moe_bytes[l];
                staging = std::max(staging, 2 * moe_bytes[l]);
                moved.push_back(l);
            }
        budget_note = "; GPU budget " + mib(budget) + (p.moe_gpu_budget_mb > 0 ? "" : " (free memory less 1 GiB)");
        if (!moved.empty())
            budget_note += ": experts of blocks " + block_ranges(moved) +
                           " moved to the CPU, the first blocks first (no usage statistics: layer order), " +
                           mib(staging) + " kept for streaming them in prompt batches";
        if (gpu_bytes + staging > budget) {
            std::string over = "the GPU's tensors need " + mib(gpu_bytes);
            if (experts_stay)
                over += ", over the GPU budget of " + mib(budget) + ", and " + arch_name +
                        "'s experts stay with their blocks (" + experts_stay + ")";
            else
                over += " with no experts among them (and " + mib(staging) + " of staging), over the GPU budget of " +
                        mib(budget);
            over += "; lower n_gpu_layers";
            plan.warning += (plan.warning.empty() ? "" : "; ") + over;
        }
    }

    size_t count[2] = {0, 0}, bytes[2] = {0, 0};
    for (const GGUFTensor& t : all) {
        const Device d = device_of(t.name);
        plan.tensors.push_back({t.name, t.nbytes, d});
        ++count[(int)d];
        bytes[(int)d] += t.nbytes;
    }
    std::vector<int32_t> apart;
    for (int32_t l = 0; l < n_layer; ++l)
        if (plan.experts_apart(l)) apart.push_back(l);
    plan.summary = "placement:";
    for (Device d : {Device::gpu, Device::cpu})
        if (count[(int)d])
            plan.summary += std::string(plan.summary.back() == ':' ? " " : "; ") + device_name(d) + " " +
                            std::to_string(count[(int)d]) + " tensors, " + mib(bytes[(int)d]);
    if (!apart.empty())
        plan.summary += "; experts of blocks " + block_ranges(apart) + " on the CPU, their blocks on CUDA";
    plan.summary += budget_note;
    return plan;
}

}  // namespace ember
