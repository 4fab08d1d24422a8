// The runtime switch overrides of _ember_test's own copy of the core: each extension module links
// the core statically, so _ember.set_switch does not reach the backends and kernels made here
// (tests/conftest.py's switches_overridden sets both).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "backend/switches.h"

namespace nb = nanobind;
using namespace ember;

void bind_kernel_switches(nb::module_& m) {
    m.def("set_switch", &set_switch, nb::arg("name"), nb::arg("value"),
          "_ember.set_switch for this module's backends and kernels ('' clears the override).");
    m.def("switch_override", &switch_override, nb::arg("name"),
          "The override this module holds for a switch ('' none).");
}
