// GGUFFile metadata lookups and typed getters; errors name the file, the key and the expected type.
#include <limits>

#include "ember/gguf.h"
#include "ember/status.h"
#include "gguf/value_util.h"

namespace ember {
namespace {

[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const GGUFValue& v,
                             const char* expected) {
    fail("metadata key '", key, "' in ", path, " has type ", gguf_type_name(v.type), ", expected ", expected);
}

uint64_t as_uint(const std::string& path, const std::string& key, const GGUFValue& v) {
    if (!v.is_integer()) wrong_type(path, key, v, "an unsigned integer");
    if (gguf_type_signed(v.type) && v.num.i < 0)
        fail("metadata key '", key, "' in ", path, " is negative (", v.num.i, "), expected an unsigned integer");
    return v.num.u;
}

double as_float(const std::string& path, const std::string& key, const GGUFValue& v) {
    if (v.is_float()) return v.num.f;
    if (v.is_integer()) return gguf_type_signed(v.type) ? double(v.num.i) : double(v.num.u);
    wrong_type(path, key, v, "a float or integer");
}

bool as_bool(const std::string& path, const std::string& key, const GGUFValue& v) {
    if (v.type != GGUFType::BOOL) wrong_type(path, key, v, "bool");
    return v.num.b;
}

const std::string& as_string(const std::string& path, const std::string& key, const GGUFValue& v) {
    if (v.type != GGUFType::STRING) wrong_type(path, key, v, "string");
    return v.str;
}

}  // namespace

const GGUFValue* GGUFFile::find(const std::string& key) const {
    for (const auto& kv : kv_)
        if (kv.first == key) return &kv.second;
    return nullptr;
}

static const GGUFValue& require(const GGUFFile& f, const std::string& key) {
    const GGUFValue* v = f.find(key);
    if (!v) fail("missing required key '", key, "' in ", f.path());
    return *v;
}

uint64_t GGUFFile::get_uint(const std::string& key) const { return as_uint(path_, key, require(*this, key)); }

int64_t GGUFFile::get_int(const std::string& key) const {
    const GGUFValue& v = require(*this, key);
    if (!v.is_integer()) wrong_type(path_, key, v, "an integer");
    if (!gguf_type_signed(v.type) && v.num.u > uint64_t(std::numeric_limits<int64_t>::max()))
        fail("metadata key '", key, "' in ", path_, " value ", v.num.u, " does not fit in int64");
    return v.num.i;
}

double GGUFFile::get_float(const std::string& key) const { return as_float(path_, key, require(*this, key)); }

bool GGUFFile::get_bool(const std::string& key) const { return as_bool(path_, key, require(*this, key)); }

const std::string& GGUFFile::get_string(const std::string& key) const {
    return as_string(path_, key, require(*this, key));
}

const GGUFValue& GGUFFile::get_array(const std::string& key) const {
    const GGUFValue& v = require(*this, key);
    if (v.type != GGUFType::ARRAY) wrong_type(path_, key, v, "array");
    return v;
}

uint64_t GGUFFile::get_uint(const std::string& key, uint64_t dflt) const {
    const GGUFValue* v = find(key);
    return v ? as_uint(path_, key, *v) : dflt;
}

double GGUFFile::get_float(const std::string& key, double dflt) const {
    const GGUFValue* v = find(key);
    return v ? as_float(path_, key, *v) : dflt;
}

bool GGUFFile::get_bool(const std::string& key, bool dflt) const {
    const GGUFValue* v = find(key);
    return v ? as_bool(path_, key, *v) : dflt;
}

std::string GGUFFile::get_string(const std::string& key, const std::string& dflt) const {
    const GGUFValue* v = find(key);
    return v ? as_string(path_, key, *v) : dflt;
}

}  // namespace ember
