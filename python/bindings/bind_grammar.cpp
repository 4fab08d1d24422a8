// Python bindings of constrained decoding's core (include/ember/grammar.h): load_llguidance,
// GrammarCompiler (a model vocabulary's compiled grammars), Grammar and GrammarMatcher.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "ember/grammar.h"
#include "ember/tokenizer.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace ember;

void bind_grammar(nb::module_& m) {
    m.def("load_llguidance", &load_llguidance, "path"_a,
          "Finds llguidance's C API in the shared library at path (llguidance._lib's file); once a process.");
    m.def("llguidance_loaded", &llguidance_loaded);

    nb::class_<GrammarMatcher>(m, "GrammarMatcher", "One sequence's grammar state.")
        .def_prop_ro(
            "mask",
            [](const GrammarMatcher& g) {
                const std::vector<uint32_t>& v = g.mask();
                auto* copy = new std::vector<uint32_t>(v);
                nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<uint32_t>*>(p); });
                return nb::ndarray<nb::numpy, uint32_t, nb::ndim<1>>(copy->data(), {copy->size()}, owner);
            },
            nb::rv_policy::move, "the tokens allowed next: bit id % 32 of word id // 32 (uint32 words)")
        .def(
            "advance",
            [](GrammarMatcher& g, int32_t token) {
                nb::gil_scoped_release unlocked;
                return g.advance(token);
            },
            "token"_a, "Takes an allowed token and computes the next mask; False (see error) when refused.")
        .def_prop_ro("accepting", &GrammarMatcher::accepting)
        .def_prop_ro("stopped", &GrammarMatcher::stopped)
        .def_prop_ro("error", &GrammarMatcher::error);

    nb::class_<Grammar>(m, "Grammar", "A compiled grammar; matcher() is a fresh state at its start.")
        .def("matcher", &Grammar::matcher);

    nb::class_<GrammarCompiler>(m, "GrammarCompiler",
                                "A model vocabulary as llguidance sees it, and the grammars compiled against it "
                                "(cached per grammar).")
        .def(
            "__init__",
            [](GrammarCompiler* self, const Tokenizer& tok) {
                nb::gil_scoped_release unlocked;
                new (self) GrammarCompiler(tok);
            },
            "tokenizer"_a, nb::keep_alive<1, 2>())
        .def(
            "compile",
            [](GrammarCompiler& c, const std::string& kind, const std::string& text) {
                nb::gil_scoped_release unlocked;
                return c.compile(kind, text);
            },
            "kind"_a, "text"_a,
            "kind: llguidance, lark, json_schema, json_object or regex. ValueError naming what is wrong.")
        .def("decode",
             [](const GrammarCompiler& c, const std::vector<int32_t>& ids) {
                 const std::string s = c.decode(ids);
                 return nb::bytes(s.data(), s.size());
             })
        .def_prop_ro("n_vocab", &GrammarCompiler::n_vocab)
        .def_prop_ro("n_cached", &GrammarCompiler::n_cached);
}
