// Python bindings for Model (load + placement) and Context (paged KV + forward), each made from
// its parameter struct (ModelParams, ContextParams).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "backend/registry.h"
#include "ember/encoder.h"
#include "ember/model.h"
#include "ember/status.h"
#include "kv_type_arg.h"
#include "model/model_impl.h"
#include "params_arg.h"

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

nb::dict plan_dict(const PlacementPlan& plan) {
    nb::dict tensors;
    for (const PlacedTensor& t : plan.tensors) tensors[t.name.c_str()] = device_name(t.device);
    nb::list blocks, experts;
    for (size_t l = 0; l < plan.block.size(); ++l) {
        blocks.append(device_name(plan.block[l]));
        experts.append(device_name(plan.experts[l]));
    }
    nb::dict out;
    out["tensors"] = tensors;
    out["blocks"] = blocks;
    out["experts"] = experts;
    out["head"] = device_name(plan.head);
    out["summary"] = plan.summary;
    out["warning"] = plan.warning;
    return out;
}

}  // namespace

void bind_model(nb::module_& m) {
    m.def("backends", &backend_names, "Names of the backends built into this ember (\"cpu\", \"cuda\").");
    bind_params<ModelParams>(m, "ModelParams", "How Model loads a file (include/ember/model.h); keywords set fields.")
        .def_rw("n_gpu_layers", &ModelParams::n_gpu_layers)
        .def_rw("main_gpu", &ModelParams::main_gpu)
        .def_rw("use_mmap", &ModelParams::use_mmap)
        .def_rw("verbose", &ModelParams::verbose)
        .def_rw("override_tensor", &ModelParams::override_tensor)
        .def_rw("cpu_moe", &ModelParams::cpu_moe)
        .def_rw("n_cpu_moe", &ModelParams::n_cpu_moe)
        .def_rw("moe_gpu_budget_mb", &ModelParams::moe_gpu_budget_mb);

    m.def(
        "placement_plan",
        [](const std::string& path, const std::optional<ModelParams>& params, bool have_gpu, int64_t gpu_free_mb,
           const nb::kwargs& fields) {
            if (gpu_free_mb < 0) fail("gpu_free_mb must be >= 0, got ", gpu_free_mb);
            const ModelParams p = params_arg(params, fields);
            const GGUFFile f(path);
            const int32_t n_layer = (int32_t)f.get_uint(f.get_string("general.architecture") + ".block_count");
            return plan_dict(plan_placement(f, n_layer, p, have_gpu, (size_t)gpu_free_mb << 20));
        },
        nb::arg("path"), nb::arg("params") = nb::none(), nb::kw_only(), nb::arg("have_gpu") = true,
        nb::arg("gpu_free_mb") = 0, nb::arg("fields"),
        "Where Model(path, params) would place each tensor, without loading it: as if a GPU were built in "
        "(have_gpu) with gpu_free_mb MiB free (0: unknown). A dict: tensors {name: 'CPU'|'CUDA'}, blocks, "
        "experts and head (devices), summary and warning (text).");

    nb::class_<Model>(m, "Model")
        .def(nb::new_([](const std::string& path, const std::optional<ModelParams>& params, const nb::kwargs& fields) {
                 const ModelParams p = params_arg(params, fields);
                 nb::gil_scoped_release release;
                 return Model::load(path, p);
             }),
             nb::arg("path"), nb::arg("params") = nb::none(), nb::arg("fields"),
             "Loads a GGUF file with a ModelParams, or its fields as keywords (Model(path, n_gpu_layers=-1)).")
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
        .def_prop_ro("placement", [](Model& mo) { return plan_dict(mo.impl().plan); })
        // llama.cpp's: the file's {arch}.pooling_type (0 none, 1 mean, 2 cls, 3 last, 4 rank);
        // none where the key is absent, as llama.cpp resolves an unspecified pooling type.
        .def_prop_ro("pooling_type",
                     [](const Model& mo) { return (int)mo.file().get_uint(mo.hparams().arch + ".pooling_type", 0); })
        // Encoders (bert, nomic-bert, gemma-embedding) run in ember.Encoder, not a Context.
        .def_prop_ro("is_encoder", [](Model& mo) { return mo.impl().arch->encoder(); })
        // Outputs of the rank classifier head (cls.output.weight rows); 0 when there is none.
        .def_prop_ro("n_cls_out", [](const Model& mo) { return classifier_outputs(mo); })
        .def_prop_ro("size_bytes",
                     [](const Model& mo) {
                         size_t total = 0;
                         for (const auto& t : mo.file().tensors()) total += t.nbytes;
                         return total;
                     })
        .def_prop_ro("n_params",
                     [](const Model& mo) {
                         int64_t total = 0;
                         for (const auto& t : mo.file().tensors()) total += t.n_elements();
                         return total;
                     })
        .def_prop_ro(
            "tokenizer", [](Model& mo) -> const Tokenizer& { return mo.tokenizer(); },
            nb::rv_policy::reference_internal);

    auto context_params = bind_params<ContextParams>(
                              m, "ContextParams",
                              "An inference context's settings (include/ember/model.h); keywords set fields.")
                              .def_rw("n_ctx", &ContextParams::n_ctx)
                              .def_rw("n_batch", &ContextParams::n_batch)
                              .def_rw("n_threads", &ContextParams::n_threads)
                              .def_rw("kv_block_size", &ContextParams::kv_block_size)
                              .def_rw("offload_kqv", &ContextParams::offload_kqv)
                              .def_rw("kv_gpu_cache_mb", &ContextParams::kv_gpu_cache_mb)
                              .def_rw("embeddings", &ContextParams::embeddings)
                              .def_rw("state_snapshot_interval", &ContextParams::state_snapshot_interval)
                              .def_rw("state_snapshot_mb", &ContextParams::state_snapshot_mb);
    def_kv_type_fields(context_params);

    nb::class_<Context>(m, "Context")
        .def(nb::new_([](std::shared_ptr<Model> model, const std::optional<ContextParams>& params,
                         const nb::kwargs& fields) {
                 return std::make_shared<Context>(std::move(model), params_arg(params, fields));
             }),
             nb::arg("model"), nb::arg("params") = nb::none(), nb::arg("fields"),
             "A context over model with a ContextParams, or its fields as keywords (Context(model, n_ctx=64)).")
        .def(
            "eval",
            [](Context& c, const std::vector<int32_t>& tokens, bool logits_all) {
                nb::gil_scoped_release release;
                c.eval(tokens.data(), (int32_t)tokens.size(), logits_all);
            },
            nb::arg("tokens"), nb::arg("logits_all") = false)
        .def(
            "logits",
            [](const Context& c, int i) { return copy_rows(c.logits(i), 1, c.model().hparams().n_vocab, false); },
            nb::arg("i") = -1)
        .def("all_logits",
             [](const Context& c) { return copy_rows(c.logits(0), c.n_logits(), c.model().hparams().n_vocab, true); })
        .def(
            "embeddings",
            [](const Context& c, int i) { return copy_rows(c.embeddings(i), 1, c.model().hparams().n_embd, false); },
            nb::arg("i") = -1)
        .def(
            "all_embeddings",
            [](const Context& c) { return copy_rows(c.embeddings(0), c.n_logits(), c.model().hparams().n_embd, true); })
        .def_prop_ro("n_logits", &Context::n_logits)
        .def_prop_ro("n_past", &Context::n_past)
        .def_prop_ro("n_evaluated", &Context::n_evaluated, "tokens run through the model since it was made")
        .def_prop_ro("n_ctx", &Context::n_ctx)
        .def("truncate", &Context::truncate, nb::arg("n_past"));
}
