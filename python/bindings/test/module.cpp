// The _ember_test extension module: single kernels and backend ops on numpy arrays for the tests
// (tests/conftest.py finds it in the CMake build folder). Built with EMBER_TEST_MODULE, never
// installed: the wheel's _ember keeps to the public API.
#include <nanobind/nanobind.h>

#include "errors.h"

namespace nb = nanobind;

void bind_kernel_quant(nb::module_& m);
void bind_kernel_backend(nb::module_& m);
void bind_kv(nb::module_& m);
void bind_kernel_choice(nb::module_& m);
void bind_kernel_switches(nb::module_& m);

NB_MODULE(_ember_test, m) {
    ember_python::register_exception_translator();
    bind_kernel_quant(m);
    bind_kernel_backend(m);
    bind_kv(m);
    bind_kernel_switches(m);
    bind_kernel_choice(m);
}
