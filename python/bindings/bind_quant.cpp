// Python bindings for the tensor type formats: type_info(type_id) -> name, block geometry and
// whether ember can quantize to it. An unknown type id -> ValueError.
#include <nanobind/nanobind.h>

#include "ember/quant.h"
#include "ember/status.h"

namespace nb = nanobind;
using namespace ember;

namespace {

nb::dict type_info(uint32_t type_id) {
    const TypeTraits* t = find_type_traits(type_id);
    if (!t) fail("quant: unknown or unsupported ggml type id ", type_id);
    nb::dict d;
    d["name"] = t->name;
    d["block_elems"] = t->block_elems;
    d["block_bytes"] = t->block_bytes;
    d["can_quantize"] = t->quantize_row != nullptr;
    return d;
}

}  // namespace

void bind_quant(nb::module_& m) {
    m.def("type_info", &type_info, nb::arg("type_id"),
          "Format of a ggml type id: {name, block_elems, block_bytes, can_quantize}.");
}
