// Python bindings for Encoder (include/ember/encoder.h): encoder models' pooled embeddings and
// rank scores over many sequences, packed into forwards.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "ember/encoder.h"
#include "ember/status.h"

namespace nb = nanobind;
using namespace ember;

namespace {

nb::ndarray<nb::numpy, float> matrix(const float* src, size_t rows, size_t cols) {
    float* buf = new float[std::max<size_t>(rows * cols, 1)];
    if (rows * cols) std::memcpy(buf, src, rows * cols * sizeof(float));
    nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    return nb::ndarray<nb::numpy, float>(buf, {rows, cols}, owner);
}

// Pooled: one [n_seq, n_out] array; pooling none: a list of [len_i, n_embd] arrays.
nb::object encode(Encoder& e, const std::vector<std::vector<int32_t>>& seqs,
                  const std::optional<std::vector<std::vector<int32_t>>>& types) {
    std::vector<float> out;
    {
        nb::gil_scoped_release release;
        out = e.encode(seqs, types ? *types : std::vector<std::vector<int32_t>>{});
    }
    if (e.pooling() != Pooling::none) return nb::cast(matrix(out.data(), seqs.size(), (size_t)e.n_out()));
    const size_t E = (size_t)e.model().hparams().n_embd;
    nb::list rows;
    size_t at = 0;
    for (const auto& s : seqs) {
        rows.append(matrix(out.data() + at * E, s.size(), E));
        at += s.size();
    }
    return rows;
}

}  // namespace

void bind_encoder(nb::module_& m) {
    nb::class_<Encoder>(m, "Encoder",
                        "Pooled embeddings (or rank scores) of whole sequences, many packed into each forward "
                        "with bidirectional attention (include/ember/encoder.h).")
        .def(
            "__init__",
            [](Encoder* self, std::shared_ptr<Model> model, int32_t n_batch, int32_t n_threads, int32_t pooling) {
                EncoderParams p;
                p.n_batch = n_batch;
                p.n_threads = n_threads;
                p.pooling = (Pooling)pooling;
                new (self) Encoder(std::move(model), p);
            },
            nb::arg("model"), nb::arg("n_batch") = kDefaultBatchTokens, nb::arg("n_threads") = 0,
            nb::arg("pooling") = -1)
        .def("encode", &encode, nb::arg("seqs"), nb::arg("token_types") = nb::none(),
             "[n_seq, n_out] float32 pooled rows, not normalized (rank: raw classifier scores); pooling 0 "
             "(none): a list of [len_i, n_embd] arrays.")
        .def_prop_ro("pooling", [](const Encoder& e) { return (int)e.pooling(); })
        .def_prop_ro("n_out", &Encoder::n_out)
        .def_prop_ro("n_batch", &Encoder::n_batch);
}
