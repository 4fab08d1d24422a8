// Python bindings of the tokenizer: Tokenizer (from a GGUF file or from plain vocab lists) and
// IncrementalDetokenizer. Text goes in as str or bytes; pieces come back as bytes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "ember/gguf.h"
#include "ember/tokenizer.h"
#include "tokenizer/vocab.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// str -> UTF-8, bytes -> as is.
std::string text_arg(nb::handle text) {
    if (nb::isinstance<nb::bytes>(text)) {
        nb::bytes b = nb::borrow<nb::bytes>(text);
        return std::string(b.c_str(), b.size());
    }
    if (nb::isinstance<nb::str>(text)) return nb::cast<std::string>(text);
    throw nb::type_error("text must be str or bytes");
}

nb::bytes as_bytes(const std::string& s) { return nb::bytes(s.data(), s.size()); }

}  // namespace

void bind_tokenizer(nb::module_& m) {
    nb::class_<ember::Tokenizer>(m, "Tokenizer")
        .def_static(
            "from_vocab",
            [](const std::string& model, std::vector<std::string> tokens, std::vector<float> scores,
               std::vector<int32_t> token_types, std::vector<std::string> merges, const std::string& pre, int32_t bos,
               int32_t eos, int32_t unk, int32_t pad, int32_t eot, int32_t eom, std::optional<bool> add_bos,
               bool add_eos, std::optional<bool> add_space_prefix, int32_t sep, std::optional<bool> add_sep,
               bool lowercase, std::optional<bool> strip_accents) {
                ember::TokenizerVocab v;
                v.model = model;
                v.pre = pre;
                v.tokens = std::move(tokens);
                v.scores = std::move(scores);
                v.types = std::move(token_types);
                v.merges = std::move(merges);
                v.bos = bos;
                v.eos = eos;
                v.unk = unk;
                v.pad = pad;
                v.eot = eot;
                v.eom = eom;
                // Defaults as for a GGUF file without the keys: SentencePiece adds BOS and a space prefix,
                // WordPiece [CLS] and [SEP], Gemma 4's BPE BOS.
                v.add_bos = add_bos.value_or(model == "llama" || model == "bert" || model == "gemma4");
                v.add_eos = add_eos;
                v.add_space_prefix = add_space_prefix.value_or(model == "llama");
                v.sep = sep;
                v.add_sep = add_sep.value_or(model == "bert");
                v.lowercase = lowercase;
                v.strip_accents = strip_accents.value_or(lowercase);
                return ember::make_tokenizer(std::move(v));
            },
            "model"_a, "tokens"_a, "scores"_a = std::vector<float>(), "token_types"_a = std::vector<int32_t>(),
            "merges"_a = std::vector<std::string>(), "pre"_a = "default", "bos"_a = -1, "eos"_a = -1, "unk"_a = -1,
            "pad"_a = -1, "eot"_a = -1, "eom"_a = -1, "add_bos"_a = nb::none(), "add_eos"_a = false,
            "add_space_prefix"_a = nb::none(), "sep"_a = -1, "add_sep"_a = nb::none(), "lowercase"_a = true,
            "strip_accents"_a = nb::none(),
            "Build from the lists a GGUF file's tokenizer.* keys hold (model 'gpt2', 'llama', 'bert', 't5' or "
            "'gemma4').")
        .def_static(
            "from_gguf_file",
            [](const std::string& path) {
                ember::GGUFFile f(path);
                return ember::Tokenizer::from_gguf(f);
            },
            "path"_a)
        .def(
            "encode",
            [](const ember::Tokenizer& t, nb::handle text, bool add_bos, bool special) {
                std::string s = text_arg(text);
                nb::gil_scoped_release release;
                return t.encode(s, add_bos, special);
            },
            "text"_a, "add_bos"_a = false, "special"_a = false)
        .def(
            "token_to_piece",
            [](const ember::Tokenizer& t, int32_t id, bool special) { return as_bytes(t.token_to_piece(id, special)); },
            "id"_a, "special"_a = false)
        .def(
            "decode",
            [](const ember::Tokenizer& t, const std::vector<int32_t>& ids, bool special) {
                return as_bytes(t.decode(ids, special));
            },
            "ids"_a, "special"_a = false)
        .def(
            "token_text", [](const ember::Tokenizer& t, int32_t id) { return as_bytes(t.token_text(id)); }, "id"_a)
        .def("is_eog", &ember::Tokenizer::is_eog, "id"_a)
        // A grammar names such a token (control, or user-defined "<...>") rather than matching its text.
        .def("is_special", &ember::Tokenizer::is_special, "id"_a)
        .def_prop_ro("n_vocab", &ember::Tokenizer::n_vocab)
        .def_prop_ro("bos", &ember::Tokenizer::bos)
        .def_prop_ro("eos", &ember::Tokenizer::eos)
        .def_prop_ro("add_bos", &ember::Tokenizer::add_bos)
        .def_prop_ro("add_eos", &ember::Tokenizer::add_eos)
        .def_prop_ro("sep", &ember::Tokenizer::sep)
        .def_prop_ro("add_sep", &ember::Tokenizer::add_sep)
        .def_prop_ro("model", &ember::Tokenizer::model,
                     "tokenizer.ggml.model: 'gpt2', 'llama', 'bert', 't5' or 'gemma4'");

    nb::class_<ember::IncrementalDetokenizer>(m, "IncrementalDetokenizer")
        .def(nb::init<const ember::Tokenizer&, bool>(), "tokenizer"_a, "special"_a = false, nb::keep_alive<1, 2>())
        .def(
            "push", [](ember::IncrementalDetokenizer& d, int32_t id) { return as_bytes(d.push(id)); }, "id"_a)
        .def("flush", [](ember::IncrementalDetokenizer& d) { return as_bytes(d.flush()); });
}
