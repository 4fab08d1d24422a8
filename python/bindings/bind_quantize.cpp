// Python binding of the model quantizer (ember-quantize).
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ember/quantize.h"

namespace nb = nanobind;

void bind_quantize(nb::module_& m) {
    m.def(
        "quantize_model",
        [](const std::string& input, const std::string& output, const std::string& type, int n_threads,
           bool allow_requantize, nb::object progress, uint64_t split_max_bytes, uint64_t split_max_tensors,
           const std::vector<std::string>& tensor_types, const std::string& output_tensor_type,
           const std::string& token_embedding_type, const std::map<std::string, std::vector<float>>& imatrix,
           const std::string& imatrix_file, const std::string& imatrix_dataset, uint32_t imatrix_chunks) {
            ember::QuantizeParams p{input, output, type, n_threads, allow_requantize};
            p.split_max_bytes = split_max_bytes;
            p.split_max_tensors = split_max_tensors;
            p.tensor_types = tensor_types;
            p.output_tensor_type = output_tensor_type;
            p.token_embedding_type = token_embedding_type;
            p.imatrix = imatrix;
            p.imatrix_file = imatrix_file;
            p.imatrix_dataset = imatrix_dataset;
            p.imatrix_chunks = imatrix_chunks;
            ember::QuantizeProgress cb;
            if (!progress.is_none())
                cb = [progress](int i, int n, const std::string& name, const char* type_name) {
                    nb::gil_scoped_acquire gil;
                    progress(i, n, name, type_name);
                };
            nb::gil_scoped_release release;
            return ember::quantize_model(p, cb);
        },
        nb::arg("input"), nb::arg("output"), nb::arg("type"), nb::arg("n_threads") = 0,
        nb::arg("allow_requantize") = false, nb::arg("progress") = nb::none(), nb::arg("split_max_bytes") = 0,
        nb::arg("split_max_tensors") = 0, nb::arg("tensor_types") = std::vector<std::string>(),
        nb::arg("output_tensor_type") = "", nb::arg("token_embedding_type") = "",
        nb::arg("imatrix") = std::map<std::string, std::vector<float>>(), nb::arg("imatrix_file") = "",
        nb::arg("imatrix_dataset") = "", nb::arg("imatrix_chunks") = 0,
        "Quantize a model; returns the files written (several when split).");
}
