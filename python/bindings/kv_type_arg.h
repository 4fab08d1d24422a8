// The KV cache type arguments of the params structs' type_k / type_v and of the test backend's
// attention, named as llama.cpp's cache types.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "ember/quant.h"
#include "ember/status.h"

// `arg` names the argument in the message.
inline ember::GGMLType kv_type_arg(const char* arg, const std::string& name) {
    if (name == "f16") return ember::GGMLType::F16;
    if (name == "bf16") return ember::GGMLType::BF16;
    if (name == "f32") return ember::GGMLType::F32;
    if (name == "q8_0") return ember::GGMLType::Q8_0;
    if (name == "q4_0") return ember::GGMLType::Q4_0;
    if (name == "q4_1") return ember::GGMLType::Q4_1;
    if (name == "q5_0") return ember::GGMLType::Q5_0;
    if (name == "q5_1") return ember::GGMLType::Q5_1;
    if (name == "iq4_nl") return ember::GGMLType::IQ4_NL;
    ember::fail(arg, " must be 'f16', 'bf16', 'f32', 'q8_0', 'q4_0', 'q4_1', 'q5_0', 'q5_1' or 'iq4_nl', got '", name,
                "'");
}

inline const char* kv_type_name(ember::GGMLType t) {
    switch (t) {
        case ember::GGMLType::F16: return "f16";
        case ember::GGMLType::BF16: return "bf16";
        case ember::GGMLType::F32: return "f32";
        case ember::GGMLType::Q8_0: return "q8_0";
        case ember::GGMLType::Q4_0: return "q4_0";
        case ember::GGMLType::Q4_1: return "q4_1";
        case ember::GGMLType::Q5_0: return "q5_0";
        case ember::GGMLType::Q5_1: return "q5_1";
        case ember::GGMLType::IQ4_NL: return "iq4_nl";
        default: ember::fail("not a KV cache type: ggml type ", (int)t);
    }
}

struct KVTypes {
    ember::GGMLType k, v;
};

// type_k / type_v name each cache (as llama.cpp's -ctk / -ctv); kv_type names both at once. A
// cache named by neither is f16.
inline KVTypes kv_types_arg(const std::optional<std::string>& kv_type, const std::optional<std::string>& type_k,
                            const std::optional<std::string>& type_v) {
    if (kv_type && (type_k || type_v))
        ember::fail("give kv_type (K and V alike) or type_k / type_v, not both; got kv_type='", *kv_type, "'");
    const ember::GGMLType both = kv_type ? kv_type_arg("kv_type", *kv_type) : ember::GGMLType::F16;
    return {type_k ? kv_type_arg("type_k", *type_k) : both, type_v ? kv_type_arg("type_v", *type_v) : both};
}

// A params struct's type_k / type_v (GGMLType fields) as properties that read and take the names.
template <class T>
void def_kv_type_fields(nanobind::class_<T>& cls) {
    cls.def_prop_rw(
           "type_k", [](const T& p) { return kv_type_name(p.type_k); },
           [](T& p, const std::string& t) { p.type_k = kv_type_arg("type_k", t); })
        .def_prop_rw(
            "type_v", [](const T& p) { return kv_type_name(p.type_v); },
            [](T& p, const std::string& t) { p.type_v = kv_type_arg("type_v", t); });
}
