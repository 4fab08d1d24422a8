// Tokenizer::from_gguf (reads the tokenizer.* keys into a TokenizerVocab), Tokenizer::decode,
// and IncrementalDetokenizer (UTF-8 safe streaming of token pieces).
#include "ember/tokenizer.h"

#include <algorithm>

#include "ember/gguf.h"
#include "ember/status.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace ember {

namespace {

const GGUFValue& array_of(const GGUFFile& f, const std::string& key, GGUFType elem) {
    const GGUFValue& a = f.get_array(key);
    if (a.elem_type != elem)
        fail("tokenizer: key '", key, "' in ", f.path(), " is an array of ", gguf_type_name(a.elem_type),
             ", expected an array of ", gguf_type_name(elem));
    return a;
}

int32_t optional_id(const GGUFFile& f, const std::string& key, int32_t dflt) {
    if (!f.find(key)) return dflt;
    int64_t id = f.get_int(key);
    if (id < -1 || id > INT32_MAX) fail("tokenizer: key '", key, "' in ", f.path(), " = ", id, " is not a token id");
    return int32_t(id);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GGUFFile& f) {
    TokenizerVocab v;
    v.model = f.get_string("tokenizer.ggml.model");
    v.pre = f.get_string("tokenizer.ggml.pre", "default");

    const GGUFValue& tokens = array_of(f, "tokenizer.ggml.tokens", GGUFType::STRING);
    v.tokens.reserve(tokens.arr.size());
    for (const GGUFValue& t : tokens.arr) v.tokens.push_back(t.str);

    if (f.find("tokenizer.ggml.scores")) {
        const GGUFValue& scores = array_of(f, "tokenizer.ggml.scores", GGUFType::FLOAT32);
        v.scores.reserve(scores.arr.size());
        for (const GGUFValue& s : scores.arr) v.scores.push_back(float(s.num.f));
    }
    if (f.find("tokenizer.ggml.token_type")) {
        const GGUFValue& types = f.get_array("tokenizer.ggml.token_type");
        v.types.reserve(types.arr.size());
        for (size_t i = 0; i < types.arr.size(); ++i) {
            const GGUFValue& t = types.arr[i];
            if (!t.is_integer())
                fail("tokenizer: key 'tokenizer.ggml.token_type' in ", f.path(), " holds ", gguf_type_name(t.type),
                     " values, expected integers");
            const bool is_signed = t.type == GGUFType::INT8 || t.type == GGUFType::INT16 || t.type == GGUFType::INT32 ||
                                   t.type == GGUFType::INT64;
            // Clamped into int32 range; make_tokenizer rejects values outside 0..6 by index.
            const int64_t x = is_signed ? t.num.i : int64_t(std::min<uint64_t>(t.num.u, 1000));
            v.types.push_back(int32_t(std::max<int64_t>(-1000, std::min<int64_t>(x, 1000))));
        }
    }
    if (f.find("tokenizer.ggml.merges")) {
        const GGUFValue& merges = array_of(f, "tokenizer.ggml.merges", GGUFType::STRING);
        v.merges.reserve(merges.arr.size());
        for (const GGUFValue& m : merges.arr) v.merges.push_back(m.str);
    }

    // SentencePiece vocabularies conventionally put <unk>, <s>, </s> at 0, 1, 2 (llama.cpp's
    // defaults when the ids are absent); byte-level BPE has no such convention.
    // BERT vocabularies put [UNK], [CLS], [SEP] at 100, 101, 102 (llama.cpp's defaults for "bert"), T5's
    // <pad>, </s>, <unk> at 0, 1, 2.
    const bool spm = v.model == "llama", bert = v.model == "bert", t5 = v.model == "t5";
    v.bos = optional_id(f, "tokenizer.ggml.bos_token_id", spm ? 1 : bert ? 101 : -1);
    v.eos = optional_id(f, "tokenizer.ggml.eos_token_id", spm ? 2 : t5 ? 1 : -1);
    v.unk = optional_id(f, "tokenizer.ggml.unknown_token_id", spm ? 0 : bert ? 100 : t5 ? 2 : -1);
    v.pad = optional_id(f, "tokenizer.ggml.padding_token_id", t5 ? 0 : -1);
    v.eot = optional_id(f, "tokenizer.ggml.eot_token_id", -1);
    v.eom = optional_id(f, "tokenizer.ggml.eom_token_id", -1);
    v.sep = optional_id(f, "tokenizer.ggml.seperator_token_id", bert ? 102 : -1);
    v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", spm || bert);
    // A BERT vocabulary ends with [SEP], not EOS, whatever add_eos_token says (as llama.cpp reads it).
    v.add_eos = !bert && f.get_bool("tokenizer.ggml.add_eos_token", t5);
    v.add_sep = f.get_bool("tokenizer.ggml.add_sep_token", bert);
    v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", spm);
    v.lowercase = f.get_bool("tokenizer.ggml.normalizer.lowercase", true);
    v.strip_accents = f.get_bool("tokenizer.ggml.normalizer.strip_accents", v.lowercase);
    v.remove_extra_whitespaces = f.get_bool("tokenizer.ggml.remove_extra_whitespaces", false);
    if (f.find("tokenizer.ggml.precompiled_charsmap")) {
        const GGUFValue& map = f.get_array("tokenizer.ggml.precompiled_charsmap");
        if (map.elem_type != GGUFType::UINT8 && map.elem_type != GGUFType::INT8)
            fail("tokenizer: key 'tokenizer.ggml.precompiled_charsmap' in ", f.path(), " is an array of ",
                 gguf_type_name(map.elem_type), ", expected bytes (uint8 or int8)");
        v.charsmap.reserve(map.arr.size());
        for (const GGUFValue& b : map.arr)
            v.charsmap.push_back(char(map.elem_type == GGUFType::UINT8 ? b.num.u : b.num.i));
    }
    if (v.model.empty()) fail("tokenizer: key 'tokenizer.ggml.model' in ", f.path(), " is empty");
    try {
        return make_tokenizer(std::move(v));
    } catch (const InvalidInput& e) {
        fail(e.what(), " (in ", f.path(), ")");
    }
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
    std::string out;
    auto* vt = dynamic_cast<const VocabTokenizer*>(this);
    bool strip_space = vt && vt->decode_strips_leading_space();
    for (int32_t id : ids) {
        std::string piece = token_to_piece(id, special);
        // SentencePiece put a space before the text when encoding: drop it from the first piece.
        if (strip_space && !piece.empty()) {
            if (piece[0] == ' ') piece.erase(0, 1);
            strip_space = false;
        }
        out += piece;
    }
    return out;
}

std::string IncrementalDetokenizer::push(int32_t id) {
    pending_ += tok_.token_to_piece(id, special_);
    // Hold back a trailing lead byte with fewer continuation bytes than it announces; anything
    // else (complete characters, stray bytes) goes out now.
    const size_t n = pending_.size();
    size_t keep = 0;
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        uint8_t c = uint8_t(pending_[n - back]);
        if ((c & 0xC0) == 0x80) continue;   // continuation byte: look further back
        if (c >= 0xC0 && c < 0xF8 && utf8_len(c) > back) keep = back;
        break;
    }
    std::string ready = pending_.substr(0, n - keep);
    pending_.erase(0, n - keep);
    return ready;
}

std::string IncrementalDetokenizer::flush() {
    std::string rest;
    rest.swap(pending_);
    return rest;
}

}  // namespace ember
