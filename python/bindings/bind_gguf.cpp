// Python bindings for the GGUF reader (GGUFFile) and streaming writer (GGUFWriter).
// Metadata values convert to plain Python objects; tensor data is a read-only numpy view of the mapping.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "ember/gguf.h"
#include "ember/status.h"

namespace nb = nanobind;
using namespace ember;

namespace {

// Strings in GGUF are meant to be UTF-8; surrogateescape keeps other bytes round-trippable.
nb::object py_str(const std::string& s) {
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
    if (!o) throw nb::python_error();
    return nb::steal(o);
}

nb::object to_py(const GGUFValue& v) {
    switch (v.type) {
        case GGUFType::UINT8:
        case GGUFType::UINT16:
        case GGUFType::UINT32:
        case GGUFType::UINT64: return nb::steal(PyLong_FromUnsignedLongLong(v.num.u));
        case GGUFType::INT8:
        case GGUFType::INT16:
        case GGUFType::INT32:
        case GGUFType::INT64: return nb::steal(PyLong_FromLongLong(v.num.i));
        case GGUFType::FLOAT32:
        case GGUFType::FLOAT64: return nb::float_(v.num.f);
        case GGUFType::BOOL: return nb::bool_(v.num.b);
        case GGUFType::STRING: return py_str(v.str);
        case GGUFType::ARRAY: {
            nb::list out;
            for (const GGUFValue& e : v.arr) out.append(to_py(e));
            return out;
        }
    }
    return nb::none();
}

// "uint32", "array[string]", "array[array[int32]]": the first element decides a nested type.
std::string type_string(const GGUFValue& v) {
    if (v.type != GGUFType::ARRAY) return gguf_type_name(v.type);
    if (v.elem_type == GGUFType::ARRAY && !v.arr.empty()) return "array[" + type_string(v.arr[0]) + "]";
    return std::string("array[") + gguf_type_name(v.elem_type) + "]";
}

GGUFType parse_type_name(const std::string& key, const std::string& name) {
    for (uint32_t t = 0; t <= static_cast<uint32_t>(GGUFType::FLOAT64); ++t)
        if (name == gguf_type_name(static_cast<GGUFType>(t))) return static_cast<GGUFType>(t);
    if (name == "str") return GGUFType::STRING;
    fail("GGUFWriter.set('", key, "'): unknown type name '", name,
         "' (expected uint8, int8, uint16, int16, uint32, int32, uint64, int64, float32, float64, bool, string)");
}

bool is_unsigned(GGUFType t) {
    return t == GGUFType::UINT8 || t == GGUFType::UINT16 || t == GGUFType::UINT32 || t == GGUFType::UINT64;
}
bool is_signed(GGUFType t) {
    return t == GGUFType::INT8 || t == GGUFType::INT16 || t == GGUFType::INT32 || t == GGUFType::INT64;
}

// Python int -> value of integer type t (or INT64/UINT64 when t is not given).
GGUFValue int_value(const std::string& key, nb::handle obj, std::optional<GGUFType> t) {
    GGUFValue v;
    nb::object idx = nb::steal(PyNumber_Index(obj.ptr()));
    if (!idx.is_valid()) throw nb::python_error();
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(idx.ptr(), &overflow);
    if (s == -1 && PyErr_Occurred()) throw nb::python_error();
    bool want_unsigned = t ? is_unsigned(*t) : (overflow > 0);
    if (want_unsigned) {
        if (overflow < 0 || (!overflow && s < 0))
            fail("GGUFWriter.set('", key, "'): negative value does not fit in an unsigned type");
        unsigned long long u = overflow ? PyLong_AsUnsignedLongLong(idx.ptr()) : static_cast<unsigned long long>(s);
        if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
            PyErr_Clear();
            fail("GGUFWriter.set('", key, "'): value does not fit in uint64");
        }
        v.type = t ? *t : GGUFType::UINT64;
        v.num.u = u;
    } else {
        if (overflow) fail("GGUFWriter.set('", key, "'): value does not fit in int64");
        v.type = t ? *t : GGUFType::INT64;
        v.num.i = s;
    }
    return v;
}

// Python object -> GGUFValue. `leaf` (from set(..., type=...)) is the type of scalars, also
// inside (nested) lists; without it: bool -> BOOL, int -> INT64, float -> FLOAT32, str -> STRING.
GGUFValue from_py(const std::string& key, nb::handle value, std::optional<GGUFType> leaf) {
    // numpy arrays and scalars convert through tolist(); `obj` owns the converted object.
    nb::object obj = nb::borrow(value);
    if (nb::hasattr(obj, "tolist") && !nb::isinstance<nb::str>(obj)) obj = obj.attr("tolist")();
    GGUFValue v;
    if (nb::isinstance<nb::list>(obj) || nb::isinstance<nb::tuple>(obj)) {
        v.type = GGUFType::ARRAY;
        for (nb::handle e : obj) v.arr.push_back(from_py(key, e, leaf));
        if (!v.arr.empty()) {
            v.elem_type = v.arr[0].type;
        } else if (leaf) {
            v.elem_type = *leaf;
        } else {
            fail("GGUFWriter.set('", key, "'): cannot infer the element type of an empty list; pass type=");
        }
        for (const GGUFValue& e : v.arr)
            if (e.type != v.elem_type)
                fail("GGUFWriter.set('", key, "'): list mixes ", gguf_type_name(v.elem_type), " and ",
                     gguf_type_name(e.type), " elements; pass type= or make them uniform");
        return v;
    }
    if (leaf == GGUFType::ARRAY) fail("GGUFWriter.set('", key, "'): type 'array' needs a list value");
    const bool is_str = nb::isinstance<nb::str>(obj), is_bytes = nb::isinstance<nb::bytes>(obj);
    if (is_str || is_bytes || leaf == GGUFType::STRING) {
        if (leaf && leaf != GGUFType::STRING)
            fail("GGUFWriter.set('", key, "'): a string value cannot be stored as ", gguf_type_name(*leaf));
        v.type = GGUFType::STRING;
        if (is_bytes) {
            nb::bytes b = nb::borrow<nb::bytes>(obj);
            v.str.assign(b.c_str(), b.size());
        } else if (is_str) {
            nb::object enc = nb::steal(PyUnicode_AsEncodedString(obj.ptr(), "utf-8", "surrogateescape"));
            if (!enc.is_valid()) throw nb::python_error();
            v.str.assign(PyBytes_AS_STRING(enc.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(enc.ptr())));
        } else {
            fail("GGUFWriter.set('", key, "'): type 'string' needs a str or bytes value");
        }
        return v;
    }
    const bool is_bool = PyBool_Check(obj.ptr());
    if (leaf == GGUFType::BOOL || (!leaf && is_bool)) {
        if (!is_bool) fail("GGUFWriter.set('", key, "'): type 'bool' needs a bool value");
        v.type = GGUFType::BOOL;
        v.num.u = 0;
        v.num.b = obj.ptr() == Py_True;
        return v;
    }
    const bool is_int = PyIndex_Check(obj.ptr());
    if (leaf && (is_signed(*leaf) || is_unsigned(*leaf))) {
        if (!is_int) fail("GGUFWriter.set('", key, "'): type '", gguf_type_name(*leaf), "' needs an int value");
        return int_value(key, obj, leaf);
    }
    if (!leaf && is_int) return int_value(key, obj, std::nullopt);
    if (PyFloat_Check(obj.ptr()) || is_int) {
        v.type = leaf ? *leaf : GGUFType::FLOAT32;
        v.num.f = PyFloat_AsDouble(obj.ptr());
        if (PyErr_Occurred()) throw nb::python_error();
        return v;
    }
    fail("GGUFWriter.set('", key, "'): unsupported value of Python type ", nb::inst_name(obj).c_str(),
         " (expected int, float, bool, str, bytes or a list)");
}

const GGUFValue& require_key(const GGUFFile& f, const std::string& key) {
    const GGUFValue* v = f.find(key);
    if (!v) fail("missing key '", key, "' in ", f.path());
    return *v;
}

using ByteView = nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>;

}  // namespace

void bind_gguf(nb::module_& m) {
    nb::class_<GGUFFile>(m, "GGUFFile", "A GGUF file mapped read-only; tensor data is viewed in place.")
        .def(nb::init<const std::string&, bool>(), nb::arg("path"), nb::arg("whole_model") = true,
             "Open a model; the first shard of a split model maps all its shards (whole_model=False: this file only).")
        .def_prop_ro("path", &GGUFFile::path)
        .def_prop_ro("split_paths", &GGUFFile::split_paths, "Every file of the model: this one, then the other shards.")
        .def_prop_ro("version", &GGUFFile::version)
        .def_prop_ro("alignment", &GGUFFile::alignment)
        .def_prop_ro("file_size", &GGUFFile::file_size)
        .def(
            "metadata",
            [](const GGUFFile& f) {
                nb::dict d;
                for (const auto& kv : f.metadata()) d[py_str(kv.first)] = to_py(kv.second);
                return d;
            },
            "All metadata as {key: int | float | bool | str | list}, in file order.")
        .def(
            "key_type", [](const GGUFFile& f, const std::string& key) { return type_string(require_key(f, key)); },
            nb::arg("key"), "Stored type of a key: 'uint32', 'string', 'array[float32]', ...")
        .def("get_uint", nb::overload_cast<const std::string&>(&GGUFFile::get_uint, nb::const_), nb::arg("key"))
        .def("get_uint", nb::overload_cast<const std::string&, uint64_t>(&GGUFFile::get_uint, nb::const_),
             nb::arg("key"), nb::arg("default"))
        .def("get_int", &GGUFFile::get_int, nb::arg("key"))
        .def("get_float", nb::overload_cast<const std::string&>(&GGUFFile::get_float, nb::const_), nb::arg("key"))
        .def("get_float", nb::overload_cast<const std::string&, double>(&GGUFFile::get_float, nb::const_),
             nb::arg("key"), nb::arg("default"))
        .def("get_bool", nb::overload_cast<const std::string&>(&GGUFFile::get_bool, nb::const_), nb::arg("key"))
        .def("get_bool", nb::overload_cast<const std::string&, bool>(&GGUFFile::get_bool, nb::const_), nb::arg("key"),
             nb::arg("default"))
        .def(
            "get_string", [](const GGUFFile& f, const std::string& key) { return py_str(f.get_string(key)); },
            nb::arg("key"))
        .def(
            "get_string",
            [](const GGUFFile& f, const std::string& key, const std::string& dflt) {
                return py_str(f.get_string(key, dflt));
            },
            nb::arg("key"), nb::arg("default"))
        .def(
            "tensors",
            [](const GGUFFile& f) {
                nb::list out;
                for (const GGUFTensor& t : f.tensors()) {
                    nb::dict d;
                    d["name"] = py_str(t.name);
                    d["type"] = static_cast<uint32_t>(t.type);
                    d["ne"] = nb::cast(t.ne);
                    d["offset"] = t.offset;
                    d["nbytes"] = t.nbytes;
                    out.append(d);
                }
                return out;
            },
            "Tensor infos: [{name, type, ne, offset (relative to the data section), nbytes}].")
        .def(
            "tensor_data",
            [](const GGUFFile& f, const std::string& name) {
                const GGUFTensor& t = f.tensor(name);
                return ByteView(t.data, {t.nbytes});
            },
            nb::arg("name"), nb::rv_policy::reference_internal,
            "Read-only uint8 view of a tensor's bytes in the mapping (keeps the file open).")
        .def("advise_willneed", &GGUFFile::advise_willneed);

    nb::class_<GGUFWriter>(m, "GGUFWriter", "Streaming GGUF v3 writer.")
        .def(nb::init<const std::string&, size_t>(), nb::arg("path"), nb::arg("alignment") = 32)
        .def(
            "set",
            [](GGUFWriter& w, const std::string& key, nb::handle value, std::optional<std::string> type) {
                std::optional<GGUFType> leaf;
                if (type) leaf = parse_type_name(key, *type);
                w.set(key, from_py(key, value, leaf));
            },
            nb::arg("key"), nb::arg("value"), nb::arg("type") = nb::none(),
            "Set a metadata key; `type` names the scalar type (also of list elements), e.g. 'uint32'.")
        .def(
            "add_tensor_info",
            [](GGUFWriter& w, const std::string& name, uint32_t type_id, const std::vector<int64_t>& ne) {
                w.add_tensor_info(name, static_cast<GGMLType>(type_id), ne);
            },
            nb::arg("name"), nb::arg("type_id"), nb::arg("ne"))
        .def("write_header", &GGUFWriter::write_header)
        .def(
            "write_tensor_data", [](GGUFWriter& w, nb::bytes b) { w.write_tensor_data(b.c_str(), b.size()); },
            nb::arg("data"))
        .def(
            "write_tensor_data",
            [](GGUFWriter& w, nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu> a) {
                w.write_tensor_data(a.data(), a.nbytes());
            },
            nb::arg("data"), "Write the next tensor's bytes (bytes or a C-contiguous array).")
        .def("finish", &GGUFWriter::finish);
}
