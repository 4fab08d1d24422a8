// Python bindings for the sampling part of the core (filled in by its owner).
#include <nanobind/nanobind.h>
namespace nb = nanobind;
void bind_sampling(nb::module_& m) { (void)m; }
