// Python bindings for the runtime switches (src/backend/switches.h): the table with each switch's
// current value, and the process-wide overrides tests and tools set instead of the environment.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "backend/switches.h"
#include "cpu/cpu_kernels.h"

namespace nb = nanobind;
using namespace ember;

namespace {

nb::list switches() {
    const Switches now = Switches::current();
    nb::list out;
    for (const SwitchInfo& r : switch_table()) {
        nb::dict d;
        d["name"] = r.name;
        d["fallback"] = r.fallback;
        d["values"] = r.values;
        d["meaning"] = r.meaning;
        d["value"] = now.get(r.name);
        d["override"] = switch_override(r.name);
        out.append(d);
    }
    return out;
}

}  // namespace

void bind_switches(nb::module_& m) {
    m.def("set_switch", &set_switch, nb::arg("name"), nb::arg("value"),
          "Override an EMBER_* runtime switch for every backend made after this call (a live model keeps "
          "the values it was made with); '' clears the override. ValueError for an unknown name or a value "
          "the switch does not take.");
    m.def("switch_override", &switch_override, nb::arg("name"),
          "The override set_switch holds for a switch ('' where none). ValueError for an unknown name.");
    m.def("switches", &switches,
          "Every EMBER_* runtime switch: a list of {name, fallback, values, meaning, value, override}, value "
          "being what a backend made now would read (override > environment > fallback).");
    m.def(
        "simd_level", [] { return std::string(simd_level_name(simd_level(Switches::current()))); },
        "The SIMD level of the CPU kernels a backend made now would run: the CPU's (scalar, avx2, avx512, "
        "neon), lowered by EMBER_SIMD.");
}
