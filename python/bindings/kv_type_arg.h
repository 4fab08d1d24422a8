// The kv_type argument of Context and Backend.attention, named as llama.cpp's cache types.
#pragma once
#include <string>

#include "ember/quant.h"
#include "ember/status.h"

inline ember::GGMLType kv_type_arg(const std::string& name) {
    if (name == "f16") return ember::GGMLType::F16;
    if (name == "f32") return ember::GGMLType::F32;
    if (name == "q8_0") return ember::GGMLType::Q8_0;
    ember::fail("kv_type must be 'f16', 'f32' or 'q8_0', got '", name, "'");
}
