// GGUF metadata value types: names, classification and on-disk sizes.
#include "gguf/value_util.h"

namespace ember {

const char* gguf_type_name(GGUFType t) {
    switch (t) {
        case GGUFType::UINT8: return "uint8";
        case GGUFType::INT8: return "int8";
        case GGUFType::UINT16: return "uint16";
        case GGUFType::INT16: return "int16";
        case GGUFType::UINT32: return "uint32";
        case GGUFType::INT32: return "int32";
        case GGUFType::FLOAT32: return "float32";
        case GGUFType::BOOL: return "bool";
        case GGUFType::STRING: return "string";
        case GGUFType::ARRAY: return "array";
        case GGUFType::UINT64: return "uint64";
        case GGUFType::INT64: return "int64";
        case GGUFType::FLOAT64: return "float64";
    }
    return "unknown";
}

bool gguf_type_valid(uint32_t t) { return t <= static_cast<uint32_t>(GGUFType::FLOAT64); }

size_t gguf_scalar_size(GGUFType t) {
    switch (t) {
        case GGUFType::UINT8:
        case GGUFType::INT8:
        case GGUFType::BOOL: return 1;
        case GGUFType::UINT16:
        case GGUFType::INT16: return 2;
        case GGUFType::UINT32:
        case GGUFType::INT32:
        case GGUFType::FLOAT32: return 4;
        case GGUFType::UINT64:
        case GGUFType::INT64:
        case GGUFType::FLOAT64: return 8;
        case GGUFType::STRING:
        case GGUFType::ARRAY: return 0;
    }
    return 0;
}

size_t gguf_min_value_size(GGUFType t) {
    if (t == GGUFType::STRING) return 8;
    if (t == GGUFType::ARRAY) return 12;
    return gguf_scalar_size(t);
}

bool gguf_type_signed(GGUFType t) {
    return t == GGUFType::INT8 || t == GGUFType::INT16 || t == GGUFType::INT32 || t == GGUFType::INT64;
}

bool GGUFValue::is_integer() const {
    switch (type) {
        case GGUFType::UINT8:
        case GGUFType::INT8:
        case GGUFType::UINT16:
        case GGUFType::INT16:
        case GGUFType::UINT32:
        case GGUFType::INT32:
        case GGUFType::UINT64:
        case GGUFType::INT64: return true;
        default: return false;
    }
}

bool GGUFValue::is_float() const { return type == GGUFType::FLOAT32 || type == GGUFType::FLOAT64; }

}  // namespace ember
