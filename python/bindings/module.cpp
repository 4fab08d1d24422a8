// The _ember extension module: each part of the core binds itself in its own bind_*.cpp.
#include <nanobind/nanobind.h>

#include <cstring>
#include <stdexcept>

#include "ember/status.h"

namespace nb = nanobind;

void bind_gguf(nb::module_& m);
void bind_quant(nb::module_& m);
void bind_tokenizer(nb::module_& m);
void bind_sampling(nb::module_& m);
void bind_model(nb::module_& m);
void bind_backend(nb::module_& m);
void bind_quantize(nb::module_& m);

namespace {
// Messages may quote bytes from a malformed file (a key name that is not UTF-8): decode them
// with backslash escapes rather than failing inside the error path.
void set_error(PyObject* type, const char* what) {
    PyObject* msg = PyUnicode_DecodeUTF8(what, (Py_ssize_t)std::strlen(what), "backslashreplace");
    PyErr_SetObject(type, msg);
    Py_XDECREF(msg);
}
}  // namespace

NB_MODULE(_ember, m) {
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const ember::OutOfMemory& e) {
            set_error(PyExc_MemoryError, e.what());
        } catch (const std::invalid_argument& e) {
            set_error(PyExc_ValueError, e.what());
        }
    });
    bind_gguf(m);
    bind_quant(m);
    bind_tokenizer(m);
    bind_sampling(m);
    bind_model(m);
    bind_backend(m);
    bind_quantize(m);
}
