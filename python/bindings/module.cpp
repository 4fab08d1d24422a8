// The _ember extension module, ember's public Python API: each part of the core binds itself in
// its own bind_*.cpp. Kernel-level test entry points live in _ember_test (test/), not here.
#include <nanobind/nanobind.h>

#include "errors.h"

namespace nb = nanobind;

void bind_gguf(nb::module_& m);
void bind_quant(nb::module_& m);
void bind_tokenizer(nb::module_& m);
void bind_sampling(nb::module_& m);
void bind_model(nb::module_& m);
void bind_encoder(nb::module_& m);
void bind_quantize(nb::module_& m);
void bind_engine(nb::module_& m);
void bind_switches(nb::module_& m);
void bind_imatrix(nb::module_& m);

void bind_grammar(nb::module_& m);
NB_MODULE(_ember, m) {
    ember_python::register_exception_translator();
    bind_gguf(m);
    bind_quant(m);
    bind_tokenizer(m);
    bind_sampling(m);
    bind_grammar(m);
    bind_model(m);
    bind_encoder(m);
    bind_quantize(m);
    bind_engine(m);
    bind_switches(m);
    bind_imatrix(m);
}
