// The C++ -> Python exception mapping shared by the extension modules (_ember, _ember_test):
// InvalidInput (std::invalid_argument) -> ValueError, OutOfMemory -> MemoryError.
#pragma once
#include <nanobind/nanobind.h>

#include <cstring>
#include <exception>
#include <stdexcept>

#include "ember/status.h"

namespace ember_python {

// Messages may quote bytes from a malformed file (a key name that is not UTF-8): decode them
// with backslash escapes rather than failing inside the error path.
inline void set_error(PyObject* type, const char* what) {
    PyObject* msg = PyUnicode_DecodeUTF8(what, (Py_ssize_t)std::strlen(what), "backslashreplace");
    PyErr_SetObject(type, msg);
    Py_XDECREF(msg);
}

inline void register_exception_translator() {
    nanobind::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const ember::OutOfMemory& e) {
            set_error(PyExc_MemoryError, e.what());
        } catch (const std::invalid_argument& e) {
            set_error(PyExc_ValueError, e.what());
        }
    });
}

}  // namespace ember_python
