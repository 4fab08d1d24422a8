// Python bindings for the model part of the core (filled in by its owner).
#include <nanobind/nanobind.h>
namespace nb = nanobind;
void bind_model(nb::module_& m) { (void)m; }
