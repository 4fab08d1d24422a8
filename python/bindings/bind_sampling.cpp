// Python bindings for the sampler: _ember.Sampler(temperature=..., ..., seed=...).sample(logits, history).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <optional>

#include "ember/grammar.h"
#include "ember/sampling.h"
#include "ember/status.h"
#include "sampling_arg.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Logits = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A custom __init__ constructs in place into the instance nanobind allocated and returns nothing:
// a returned Sampler* would be cast back to a new reference to that instance which nothing drops,
// so the instance, its type and its methods would outlive the interpreter (nanobind's leak report).
void init_sampler(ember::Sampler* self, float temperature, int32_t top_k, float top_p, float min_p,
                  float repeat_penalty, float frequency_penalty, float presence_penalty, int32_t penalty_last_n,
                  const std::optional<std::map<int32_t, float>>& logit_bias, uint64_t seed, float typical_p,
                  int32_t mirostat, float mirostat_tau, float mirostat_eta) {
    std::vector<std::pair<int32_t, float>> bias;
    if (logit_bias) bias.assign(logit_bias->begin(), logit_bias->end());
    ember::SamplingParams p = sampling_params_arg(temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty,
                                                  presence_penalty, penalty_last_n, std::move(bias), seed);
    p.typical_p = typical_p;
    p.mirostat = mirostat;
    p.mirostat_tau = mirostat_tau;
    p.mirostat_eta = mirostat_eta;
    new (self) ember::Sampler(p);
}

}  // namespace

void bind_sampling(nb::module_& m) {
    nb::class_<ember::Sampler>(
        m, "Sampler",
        "Token sampler: logit_bias -> penalties -> top_k -> typical_p -> top_p -> min_p -> temperature -> draw "
        "(greedy when temperature <= 0; mirostat 1 or 2 draws by surprise after the temperature instead of "
        "the truncations). seed 0xFFFFFFFF draws a random seed.")
        .def("__init__", &init_sampler, "temperature"_a = 0.8f, "top_k"_a = 40, "top_p"_a = 0.95f, "min_p"_a = 0.05f,
             "repeat_penalty"_a = 1.0f, "frequency_penalty"_a = 0.0f, "presence_penalty"_a = 0.0f,
             "penalty_last_n"_a = 64, "logit_bias"_a = nb::none(), "seed"_a = 0xFFFFFFFFull, "typical_p"_a = 1.0f,
             "mirostat"_a = 0, "mirostat_tau"_a = 5.0f, "mirostat_eta"_a = 0.1f)
        .def(
            "sample",
            [](ember::Sampler& s, Logits logits, const std::vector<int32_t>& history,
               const ember::GrammarMatcher* matcher) {
                if (logits.shape(0) > static_cast<size_t>(INT32_MAX))
                    ember::fail("Sampler.sample: logits has too many entries (", logits.shape(0), ")");
                const int32_t n = static_cast<int32_t>(logits.shape(0));
                nb::gil_scoped_release unlocked;
                if (!matcher) return s.sample(logits.data(), n, history);
                if (!matcher->error().empty()) ember::fail(matcher->error());
                std::vector<float> masked(logits.data(), logits.data() + n);
                ember::apply_token_mask(masked.data(), n, matcher->mask());
                return s.sample(masked.data(), n, history);
            },
            "logits"_a, "history"_a = std::vector<int32_t>{}, "matcher"_a = nb::none(),
            "Draws one token id from logits [n_vocab] float32; history = tokens so far (for penalties); "
            "matcher: a GrammarMatcher whose mask bans the tokens it does not allow.")
        .def_prop_ro("temperature", [](const ember::Sampler& s) { return s.params().temperature; })
        .def_prop_ro("top_k", [](const ember::Sampler& s) { return s.params().top_k; })
        .def_prop_ro("top_p", [](const ember::Sampler& s) { return s.params().top_p; })
        .def_prop_ro("min_p", [](const ember::Sampler& s) { return s.params().min_p; })
        .def_prop_ro("seed", [](const ember::Sampler& s) { return s.params().seed; })
        .def_prop_ro("typical_p", [](const ember::Sampler& s) { return s.params().typical_p; })
        .def_prop_ro("mirostat", [](const ember::Sampler& s) { return s.params().mirostat; });
}
