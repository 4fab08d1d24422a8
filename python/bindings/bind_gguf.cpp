// Python bindings for the gguf part of the core (filled in by its owner).
#include <nanobind/nanobind.h>
namespace nb = nanobind;
void bind_gguf(nb::module_& m) { (void)m; }
