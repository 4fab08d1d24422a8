// Python bindings for the tokenizer part of the core (filled in by its owner).
#include <nanobind/nanobind.h>
namespace nb = nanobind;
void bind_tokenizer(nb::module_& m) { (void)m; }
