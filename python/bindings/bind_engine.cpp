// Python bindings for the continuous-batching engine: _ember.EngineParams, _ember.Engine (add_request /
// cancel / poll / stats / close) and _ember.EngineOutput. poll waits with the GIL released, so the loop thread
// and other Python threads run meanwhile; the GIL is never taken per token.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>

#include "ember/engine.h"
#include "ember/status.h"
#include "kv_type_arg.h"
#include "params_arg.h"
#include "sampling_arg.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace ember;

void bind_engine(nb::module_& m) {
    m.attr("MAX_LOGPROBS") = RequestParams::kMaxLogprobs;
    nb::class_<EngineOutput>(m, "EngineOutput", "New tokens of one request since its previous output.")
        .def_ro("request_id", &EngineOutput::request_id)
        .def_ro("token_ids", &EngineOutput::token_ids)
        .def_ro("logprobs", &EngineOutput::logprobs)
        .def_ro("ranks", &EngineOutput::ranks)
        .def_ro("top_logprobs", &EngineOutput::top_logprobs)
        .def_ro("prompt_logprobs", &EngineOutput::prompt_logprobs)
        .def_ro("prompt_ranks", &EngineOutput::prompt_ranks)
        .def_ro("prompt_top_logprobs", &EngineOutput::prompt_top_logprobs)
        .def_ro("num_cached_tokens", &EngineOutput::num_cached_tokens)
        .def_ro("finished", &EngineOutput::finished)
        .def_ro("finish_reason", &EngineOutput::finish_reason)
        .def_ro("stop_token_id", &EngineOutput::stop_token_id,
                "the stop_token_ids entry that ended the request, else -1")
        .def_ro("error", &EngineOutput::error)
        .def("__repr__", [](const EngineOutput& o) {
            return cat("EngineOutput(request_id=", o.request_id, ", ", o.token_ids.size(),
                       " tokens, finished=", o.finished ? "True" : "False", ", finish_reason='", o.finish_reason, "')");
        });

    auto engine_params = bind_params<EngineParams>(m, "EngineParams",
                                                   "The engine's settings (engine.h); keywords set fields.")
                             .def_rw("n_ctx", &EngineParams::n_ctx)
                             .def_rw("max_num_seqs", &EngineParams::max_num_seqs)
                             .def_rw("max_num_batched_tokens", &EngineParams::max_num_batched_tokens)
                             .def_rw("n_threads", &EngineParams::n_threads)
                             .def_rw("kv_block_size", &EngineParams::kv_block_size)
                             .def_rw("kv_blocks", &EngineParams::kv_blocks)
                             .def_rw("state_snapshot_interval", &EngineParams::state_snapshot_interval)
                             .def_rw("state_snapshot_mb", &EngineParams::state_snapshot_mb)
                             .def_rw("kv_mb", &EngineParams::kv_mb)
                             .def_rw("kv_host_mb", &EngineParams::kv_host_mb)
                             .def_rw("enable_prefix_caching", &EngineParams::enable_prefix_caching)
                             .def_rw("deterministic", &EngineParams::deterministic)
                             .def_rw("offload_kqv", &EngineParams::offload_kqv)
                             .def_rw("kv_gpu_cache_mb", &EngineParams::kv_gpu_cache_mb);
    def_kv_type_fields(engine_params);

    nb::class_<Engine>(
        m, "Engine",
        "Continuous batching over one model: requests share the paged KV pool (with prefix caching and "
        "an optional host tier, kv_host_mb) and every forward step; a loop thread of its own runs the steps. "
        "Made from an EngineParams, or its fields as keywords (Engine(model, n_ctx=256)).")
        .def(nb::new_(
                 [](std::shared_ptr<Model> model, const std::optional<EngineParams>& params, const nb::kwargs& fields) {
                     const EngineParams p = params_arg(params, fields);
                     nb::gil_scoped_release release;
                     return std::make_shared<Engine>(std::move(model), p);
                 }),
             "model"_a, "params"_a = nb::none(), "fields"_a)
        .def(
            "add_request",
            [](Engine& e, const std::vector<int32_t>& prompt, float temperature, int32_t top_k, float top_p,
               float min_p, float repeat_penalty, float frequency_penalty, float presence_penalty,
               int32_t penalty_last_n, const std::vector<std::pair<int32_t, float>>& logit_bias, uint64_t seed,
               int32_t max_tokens, int32_t min_tokens, const std::vector<int32_t>& stop_token_ids, bool ignore_eos,
               int32_t logprobs, bool prompt_logprobs, int32_t prompt_top_logprobs, const std::string& grammar_kind,
               const std::string& grammar) {
                RequestParams r;
                r.prompt = prompt;
                r.sampling = sampling_params_arg(temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty,
                                                 presence_penalty, penalty_last_n, logit_bias, seed);
                r.max_tokens = max_tokens;
                r.min_tokens = min_tokens;
                r.stop_token_ids = stop_token_ids;
                r.ignore_eos = ignore_eos;
                r.logprobs = logprobs;
                r.prompt_logprobs = prompt_logprobs;
                r.prompt_top_logprobs = prompt_top_logprobs;
                r.grammar_kind = grammar_kind;
                r.grammar = grammar;
                // A new grammar compiles here: other Python threads run meanwhile.
                nb::gil_scoped_release release;
                return e.add_request(r);
            },
            "prompt"_a, nb::kw_only(), "temperature"_a = 0.8f, "top_k"_a = 40, "top_p"_a = 0.95f, "min_p"_a = 0.05f,
            "repeat_penalty"_a = 1.0f, "frequency_penalty"_a = 0.0f, "presence_penalty"_a = 0.0f,
            "penalty_last_n"_a = 64, "logit_bias"_a = std::vector<std::pair<int32_t, float>>{},
            "seed"_a = 0xFFFFFFFFull, "max_tokens"_a = 16, "min_tokens"_a = 0,
            "stop_token_ids"_a = std::vector<int32_t>{}, "ignore_eos"_a = false, "logprobs"_a = -1,
            "prompt_logprobs"_a = false, "prompt_top_logprobs"_a = 0, "grammar_kind"_a = "", "grammar"_a = "",
            "Queues a request; returns its id. grammar_kind / grammar: constrained decoding (ember.structured "
            "makes them; llguidance must be loaded).")
        .def("cancel", &Engine::cancel, "request_id"_a)
        .def(
            "poll",
            [](Engine& e, double timeout) {
                nb::gil_scoped_release release;
                return e.poll(timeout);
            },
            "timeout"_a = 0.0, "Waits up to timeout seconds for outputs; returns all pending ones.")
        .def("stats",
             [](const Engine& e) {
                 const EngineStats s = e.stats();
                 nb::dict d;
                 d["running"] = s.running;
                 d["waiting"] = s.waiting;
                 d["kv_blocks_total"] = s.kv_blocks_total;
                 d["kv_blocks_used"] = s.kv_blocks_used;
                 d["kv_blocks_cached"] = s.kv_blocks_cached;
                 d["prefix_cache_queries"] = s.prefix_cache_queries;
                 d["prefix_cache_hits"] = s.prefix_cache_hits;
                 d["cached_prompt_tokens"] = s.cached_prompt_tokens;
                 d["preemptions"] = s.preemptions;
                 d["swapped"] = s.swapped;
                 d["swaps_out"] = s.swaps_out;
                 d["swaps_in"] = s.swaps_in;
                 d["host_blocks_total"] = s.host_blocks_total;
                 d["host_blocks_used"] = s.host_blocks_used;
                 d["host_blocks_cached"] = s.host_blocks_cached;
                 d["host_cache_hits"] = s.host_cache_hits;
                 d["state_slots_total"] = s.state_slots_total;
                 d["state_slots_free"] = s.state_slots_free;
                 d["prompt_tokens"] = s.prompt_tokens;
                 d["generation_tokens"] = s.generation_tokens;
                 d["steps"] = s.steps;
                 d["seconds_schedule"] = s.seconds_schedule;
                 d["seconds_forward"] = s.seconds_forward;
                 d["seconds_sample"] = s.seconds_sample;
                 d["seconds_output"] = s.seconds_output;
                 d["seconds_grammar_wait"] = s.seconds_grammar_wait;
                 return d;
             })
        .def("close",
             [](Engine& e) {
                 nb::gil_scoped_release release;
                 e.close();
             })
        .def_prop_ro("n_ctx", [](const Engine& e) { return e.params().n_ctx; })
        .def_prop_ro("max_num_seqs", [](const Engine& e) { return e.params().max_num_seqs; })
        .def_prop_ro("kv_block_size", [](const Engine& e) { return e.params().kv_block_size; });
}
