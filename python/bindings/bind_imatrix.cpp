// Python binding of the importance-matrix collection (ember-imatrix; src/model/imatrix_collector.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "model/imatrix_collector.h"

namespace nb = nanobind;

void bind_imatrix(nb::module_& m) {
    m.def(
        "imatrix_start",
        [](bool process_output) {
            ember::set_imatrix_collector(std::make_shared<ember::ImatrixCollector>(process_output));
        },
        nb::arg("process_output") = false,
        "Contexts made from now on record every block weight's input column sums of squares (and the "
        "output head's with process_output) until imatrix_stop.");
    m.def(
        "imatrix_stop",
        []() {
            auto c = ember::imatrix_collector();
            ember::set_imatrix_collector(nullptr);
            nb::dict out;
            if (!c) return out;
            for (const auto& [name, e] : c->entries()) out[nb::str(name.c_str())] = nb::make_tuple(e.sums, e.counts);
            return out;
        },
        "Ends the collection: {weight name: (column sums of squares [n_mat * n_in], tokens per matrix [n_mat])}; "
        "n_mat is a stacked expert tensor's expert count, else 1.");
}
