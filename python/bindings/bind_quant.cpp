// Python bindings for the quant part of the core (filled in by its owner).
#include <nanobind/nanobind.h>
namespace nb = nanobind;
void bind_quant(nb::module_& m) { (void)m; }
