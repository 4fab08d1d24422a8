// libFuzzer target: the tokenizer on arbitrary bytes, for a byte-level BPE vocabulary (SmolLM2's)
// and a SentencePiece one (tests/fuzz/vocab/). The first input byte picks the vocabulary and the
// operation; the rest is the text, or the token ids, to run it on.
//   encode:  every id is in the vocabulary; byte-level BPE decodes valid UTF-8 back to itself
//            where the vocabulary has a token for each of its bytes (SmolLM2's lacks six
//            control bytes, which encode as the unknown token)
//   decode:  ids outside the vocabulary throw InvalidInput; IncrementalDetokenizer's pieces
//            joined equal decode()
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "ember/gguf.h"
#include "ember/status.h"
#include "ember/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

struct Vocabs {
    std::unique_ptr<ember::Tokenizer> bpe, spm;
    bool bpe_lacks_byte[256];   // no token is the byte's GPT-2 codepoint
};

std::unique_ptr<ember::Tokenizer> load(const char* name) {
    const char* dir = std::getenv("EMBER_FUZZ_VOCAB_DIR");
    const std::string path = std::string(dir ? dir : EMBER_FUZZ_VOCAB_DIR) + "/" + name;
    try {
        ember::GGUFFile f(path);
        return ember::Tokenizer::from_gguf(f);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", path.c_str(), e.what());
        std::abort();
    }
}

const Vocabs& vocabs() {
    static const Vocabs v = [] {
        Vocabs r{load("smollm2.gguf"), load("spm.gguf"), {}};
        std::unordered_set<std::string> texts;
        for (int32_t id = 0; id < r.bpe->n_vocab(); ++id) texts.insert(r.bpe->token_text(id));
        for (int b = 0; b < 256; ++b) r.bpe_lacks_byte[b] = !texts.count(ember::byte_to_unicode(uint8_t(b)));
        return r;
    }();
    return v;
}

bool covered(const std::string& text) {
    for (char c : text)
        if (vocabs().bpe_lacks_byte[uint8_t(c)]) return false;
    return true;
}

bool valid_utf8(const std::string& s) {
    for (size_t i = 0; i < s.size();) {
        const uint8_t c = uint8_t(s[i]);
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            cp = c & 0x07;
        } else return false;
        if (i + len > s.size()) return false;
        for (size_t k = 1; k < len; ++k) {
            const uint8_t cc = uint8_t(s[i + k]);
            if ((cc & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += len;
    }
    return true;
}

[[noreturn]] void violated(const char* what) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    std::abort();
}

void check_encode(const ember::Tokenizer& tok, bool byte_level, const std::string& text, bool add_bos, bool special) {
    const std::vector<int32_t> ids = tok.encode(text, add_bos, special);
    for (int32_t id : ids)
        if (id < 0 || id >= tok.n_vocab()) violated("encode returned an id outside the vocabulary");
    const std::string back = tok.decode(ids, true);
    if (byte_level && !add_bos && valid_utf8(text) && covered(text) && back != text)
        violated("byte-level BPE did not decode valid UTF-8 back to itself");
}

// ids: raw int32s (mostly out of range, so the check that throws runs), or folded into
// [-2, n_vocab + 2) so most decode.
void check_decode(const ember::Tokenizer& tok, const uint8_t* data, size_t size, bool fold, bool special) {
    std::vector<int32_t> ids(size / 4);
    for (size_t i = 0; i < ids.size(); ++i) {
        uint32_t raw;
        std::memcpy(&raw, data + 4 * i, 4);
        ids[i] = fold ? int32_t(raw % uint32_t(tok.n_vocab() + 4)) - 2 : int32_t(raw);
    }
    bool in_range = true;
    for (int32_t id : ids) in_range &= id >= 0 && id < tok.n_vocab();
    std::string whole;
    try {
        whole = tok.decode(ids, special);
        if (!in_range) violated("decode accepted an id outside the vocabulary");
    } catch (const ember::InvalidInput&) {
        if (in_range) violated("decode threw on ids inside the vocabulary");
        return;
    }
    ember::IncrementalDetokenizer detok(tok, special);
    std::string streamed;
    for (int32_t id : ids) streamed += detok.push(id);
    streamed += detok.flush();
    // decode() drops the SentencePiece prefix space, the detokenizer does not.
    const bool strips = !streamed.empty() && streamed != whole && streamed.substr(1) == whole && streamed[0] == ' ';
    if (streamed != whole && !strips) violated("IncrementalDetokenizer pieces differ from decode()");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const uint8_t op = data[0];
    const bool byte_level = (op & 1) == 0;
    const ember::Tokenizer& tok = byte_level ? *vocabs().bpe : *vocabs().spm;
    const uint8_t* rest = data + 1;
    const size_t n = size - 1;
    switch ((op >> 1) & 3) {
        case 0:
        case 1:
            check_encode(tok, byte_level, std::string(reinterpret_cast<const char*>(rest), n), (op & 8) != 0,
                         (op & 2) != 0);
            break;
        case 2: check_decode(tok, rest, n, true, (op & 8) != 0); break;
        case 3: check_decode(tok, rest, n, (op & 8) != 0, (op & 16) != 0); break;
    }
    return 0;
}
