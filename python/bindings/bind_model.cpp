// Python bindings for Model (load + placement) and Context (paged KV + forward).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "backend/registry.h"
#include "ember/model.h"
#include "ember/status.h"
#include "kv_type_arg.h"

namespace nb = nanobind;
using namespace ember;

namespace {

nb::ndarray<nb::numpy, float> copy_rows(const float* src, size_t rows, size_t cols, bool matrix) {
    float* buf = new float[rows * cols];
    std::memcpy(buf, src, rows * cols * sizeof(float));
    nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    if (!matrix) return nb::ndarray<nb::numpy, float>(buf, {cols}, owner);
    return nb::ndarray<nb::numpy, float>(buf, {rows, cols}, owner);
}

}  // namespace

void bind_model(nb::module_& m) {
    m.def("backends", &backend_names, "Names of the backends built into this ember (\"cpu\", \"cuda\").");
    nb::class_<Model>(m, "Model")
        .def(nb::new_([](const std::string& path, int n_gpu_layers, int main_gpu, bool use_mmap, bool verbose) {
                 ModelParams p;
                 p.n_gpu_layers = n_gpu_layers;
                 p.main_gpu = main_gpu;
                 p.use_mmap = use_mmap;
                 p.verbose = verbose;
                 nb::gil_scoped_release release;
                 return Model::load(path, p);
             }),
             nb::arg("path"), nb::arg("n_gpu_layers") = 0, nb::arg("main_gpu") = 0, nb::arg("use_mmap") = true,
             nb::arg("verbose") = false)
        .def_prop_ro("arch", [](const Model& mo) { return mo.hparams().arch; })
        .def_prop_ro("n_vocab", [](const Model& mo) { return mo.hparams().n_vocab; })
        .def_prop_ro("n_ctx_train", [](const Model& mo) { return mo.hparams().n_ctx_train; })
        .def_prop_ro("n_layer", [](const Model& mo) { return mo.hparams().n_layer; })
        .def_prop_ro("n_embd", [](const Model& mo) { return mo.hparams().n_embd; })
        .def_prop_ro("n_head", [](const Model& mo) { return mo.hparams().n_head; })
        .def_prop_ro("n_head_kv", [](const Model& mo) { return mo.hparams().n_head_kv; })
        .def_prop_ro("head_dim", [](const Model& mo) { return mo.hparams().head_dim; })
        .def_prop_ro("n_gpu_layers", [](const Model& mo) { return mo.params().n_gpu_layers; })
        .def_prop_ro("use_mmap", [](const Model& mo) { return mo.params().use_mmap; })
        .def_prop_ro("path", [](const Model& mo) { return mo.file().path(); })
        // llama.cpp's: the file's {arch}.pooling_type (0 none, 1 mean, 2 cls, 3 last, 4 rank);
        // none where the key is absent, as llama.cpp resolves an unspecified pooling type.
        .def_prop_ro("pooling_type", [](const Model& mo) {
            return (int)mo.file().get_uint(mo.hparams().arch + ".pooling_type", 0);
        })
        .def_prop_ro("size_bytes", [](const Model& mo) {
            size_t total = 0;
            for (const auto& t : mo.file().tensors()) total += t.nbytes;
            return total;
        })
        .def_prop_ro("n_params", [](const Model& mo) {
            int64_t total = 0;
            for (const auto& t : mo.file().tensors()) total += t.n_elements();
            return total;
        })
        .def_prop_ro("tokenizer", [](Model& mo) -> const Tokenizer& { return mo.tokenizer(); },
                     nb::rv_policy::reference_internal);

    m.attr("DEFAULT_KV_GPU_CACHE_MB") = ContextParams::kDefaultKvGpuCacheMiB;

    nb::class_<Context>(m, "Context")
        .def(nb::new_([](std::shared_ptr<Model> model, int n_ctx, int n_batch, int n_threads, int kv_block_size,
                         bool offload_kqv, const std::optional<std::string>& kv_type,
                         const std::optional<std::string>& type_k, const std::optional<std::string>& type_v,
                         bool embeddings, int kv_gpu_cache_mb) {
                 ContextParams p;
                 p.n_ctx = n_ctx;
                 p.n_batch = n_batch;
                 p.n_threads = n_threads;
                 p.kv_block_size = kv_block_size;
                 p.offload_kqv = offload_kqv;
                 p.kv_gpu_cache_mb = kv_gpu_cache_mb;
                 const KVTypes t = kv_types_arg(kv_type, type_k, type_v);
                 p.type_k = t.k;
                 p.type_v = t.v;
                 p.embeddings = embeddings;
                 return std::make_shared<Context>(std::move(model), p);
             }),
             nb::arg("model"), nb::arg("n_ctx") = 512, nb::arg("n_batch") = 512, nb::arg("n_threads") = 0,
             nb::arg("kv_block_size") = 16, nb::arg("offload_kqv") = true, nb::arg("kv_type") = nb::none(),
             nb::arg("type_k") = nb::none(), nb::arg("type_v") = nb::none(), nb::arg("embedding") = false,
             nb::arg("kv_gpu_cache_mb") = ContextParams::kDefaultKvGpuCacheMiB)
        .def("eval",
             [](Context& c, const std::vector<int32_t>& tokens, bool logits_all) {
                 nb::gil_scoped_release release;
                 c.eval(tokens.data(), (int32_t)tokens.size(), logits_all);
             },
             nb::arg("tokens"), nb::arg("logits_all") = false)
        .def("logits",
             [](const Context& c, int i) {
                 return copy_rows(c.logits(i), 1, c.model().hparams().n_vocab, false);
             },
             nb::arg("i") = -1)
        .def("all_logits",
             [](const Context& c) {
                 return copy_rows(c.logits(0), c.n_logits(), c.model().hparams().n_vocab, true);
             })
        .def("embeddings",
             [](const Context& c, int i) {
                 return copy_rows(c.embeddings(i), 1, c.model().hparams().n_embd, false);
             },
             nb::arg("i") = -1)
        .def("all_embeddings",
             [](const Context& c) {
                 return copy_rows(c.embeddings(0), c.n_logits(), c.model().hparams().n_embd, true);
             })
        .def_prop_ro("n_logits", &Context::n_logits)
        .def_prop_ro("n_past", &Context::n_past)
        .def_prop_ro("n_ctx", &Context::n_ctx)
        .def("truncate", &Context::truncate, nb::arg("n_past"));
}
