// The parameter structs (ModelParams, ContextParams, EngineParams) on the Python side: built from
// keyword arguments naming their fields, the rest keeping the C++ defaults, so no default is
// written twice; Model, Context and Engine take one struct, or its fields as keywords.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <vector>

#include "ember/status.h"

namespace params_arg_detail {

// def_rw and def_prop_rw fields are plain properties of the class.
inline bool is_field(nanobind::handle cls, nanobind::handle name) {
    nanobind::object value = nanobind::getattr(cls, name, nanobind::none());
    return PyObject_IsInstance(value.ptr(), (PyObject*)&PyProperty_Type) == 1;
}

// The class's own attribute names, in the order they were bound.
inline std::vector<std::string> attribute_names(nanobind::handle cls) {
    std::vector<std::string> out;
    for (nanobind::handle name : cls.attr("__dict__")) out.push_back(nanobind::cast<std::string>(name));
    return out;
}

}  // namespace params_arg_detail

// The names of a bound params class's fields, in declaration order: "n_ctx, n_batch, ...".
inline std::string params_field_list(nanobind::handle cls) {
    std::string out;
    for (const std::string& s : params_arg_detail::attribute_names(cls)) {
        if (s.empty() || s[0] == '_' || !params_arg_detail::is_field(cls, nanobind::str(s.c_str()))) continue;
        out += (out.empty() ? "" : ", ") + s;
    }
    return out;
}

// A copy of base (default-constructed when absent) with each keyword argument set on its field;
// a name that is no field throws InvalidInput listing the fields.
template <class T>
T params_arg(const std::optional<T>& base, const nanobind::kwargs& fields) {
    nanobind::object obj = nanobind::cast(base ? *base : T{});
    nanobind::handle cls = obj.type();
    for (auto [name, value] : fields) {
        if (!params_arg_detail::is_field(cls, name))
            ember::fail(nanobind::cast<std::string>(cls.attr("__name__")), " has no field '",
                        nanobind::cast<std::string>(name), "'; its fields: ", params_field_list(cls));
        nanobind::setattr(obj, name, value);
    }
    return nanobind::cast<T>(obj);
}

// "ContextParams(n_ctx=512, n_batch=512, ...)".
inline std::string params_repr(nanobind::handle self) {
    nanobind::handle cls = self.type();
    std::string out = nanobind::cast<std::string>(cls.attr("__name__")) + "(";
    bool first = true;
    for (const std::string& s : params_arg_detail::attribute_names(cls)) {
        if (s.empty() || s[0] == '_' || !params_arg_detail::is_field(cls, nanobind::str(s.c_str()))) continue;
        out += (first ? "" : ", ") + s + "=" + nanobind::cast<std::string>(nanobind::repr(self.attr(s.c_str())));
        first = false;
    }
    return out + ")";
}

// Binds T's keyword constructor (fields as keywords) and its repr; the fields are the caller's.
template <class T>
nanobind::class_<T> bind_params(nanobind::module_& m, const char* name, const char* doc) {
    return nanobind::class_<T>(m, name, doc)
        .def("__init__",
             [](T* self, const nanobind::kwargs& fields) { new (self) T(params_arg<T>(std::nullopt, fields)); })
        .def("__repr__", [](nanobind::handle self) { return params_repr(self); });
}
