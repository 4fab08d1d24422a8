// The _ember extension module: each part of the core binds itself in its own bind_*.cpp.
#include <nanobind/nanobind.h>

#include "ember/status.h"

namespace nb = nanobind;

void bind_gguf(nb::module_& m);
void bind_quant(nb::module_& m);
void bind_tokenizer(nb::module_& m);
void bind_sampling(nb::module_& m);
void bind_model(nb::module_& m);
void bind_backend(nb::module_& m);
void bind_quantize(nb::module_& m);

NB_MODULE(_ember, m) {
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const ember::OutOfMemory& e) {
            PyErr_SetString(PyExc_MemoryError, e.what());
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
