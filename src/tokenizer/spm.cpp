// SentencePiece-style BPE (tokenizer.ggml.model = "llama"): spaces become U+2581 (with a leading
// one where add_space_prefix asks), the highest-scoring adjacent pair that is a vocab token is
// merged first, and characters that end up outside the vocab fall back to <0xNN> byte tokens.
#include <algorithm>

#include "tokenizer/symbol_merge.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace ember {

namespace {

class SpmTokenizer final : public VocabTokenizer {
public:
    explicit SpmTokenizer(TokenizerVocab vocab) : VocabTokenizer(std::move(vocab)) {
        for (int b = 0; b < 256; ++b) {
            char name[7] = {'<', '0', 'x', "0123456789ABCDEF"[b >> 4], "0123456789ABCDEF"[b & 15], '>', 0};
            int32_t id = find_token(name);
            if (id < 0) id = find_token(std::string(1, char(b)));
            byte_ids_[b] = id;
        }
    }

    bool decode_strips_leading_space() const override { return v_.add_space_prefix; }

protected:
    void encode_fragment(const std::string& text, bool after_special, std::vector<int32_t>& out) const override {
        std::string s;
        s.reserve(text.size() + 8);
        if (v_.add_space_prefix && after_special) s += k_space_mark;
        for (char c : text) {
            if (c == ' ') s += k_space_mark;
            else s.push_back(c);
        }
        merge(s, out);
    }

    std::string normal_piece(int32_t id) const override {
        const std::string& t = v_.tokens[id];
        return spaces_from_marks(t);
    }

private:
    float score(int32_t id) const { return v_.scores.empty() ? 0.0f : v_.scores[id]; }

    void merge(const std::string& s, std::vector<int32_t>& out) const {
        if (s.empty()) return;
        std::vector<MergeSymbol> syms = split_characters(s);
        // The merged piece must be a token; higher scores merge first.
        merge_symbols(syms, [&](const MergeSymbol& l, const MergeSymbol& r, double& priority) {
            const int32_t id = find_token(s.substr(l.start, l.len + r.len));
            if (id >= 0) priority = score(id);
            return id >= 0;
        });

        // Every merged symbol is a token; a single character may not be: its bytes then go
        // through the byte tokens, or the whole character becomes unknown without them.
        for (int i = 0; i >= 0; i = syms[i].next) {
            const MergeSymbol& sym = syms[i];
            int32_t id = find_token(s.substr(sym.start, sym.len));
            if (id >= 0) {
                out.push_back(id);
                continue;
            }
            bool bytes_ok = true;
            for (size_t k = 0; k < sym.len; ++k) bytes_ok &= byte_ids_[uint8_t(s[sym.start + k])] >= 0;
            if (bytes_ok) {
                for (size_t k = 0; k < sym.len; ++k) out.push_back(byte_ids_[uint8_t(s[sym.start + k])]);
            } else if (v_.unk >= 0) {
                out.push_back(v_.unk);
            }
        }
    }

    int32_t byte_ids_[256];   // byte -> <0xNN> token (or the 1-byte token), -1 if neither
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerVocab vocab) {
    return std::make_unique<SpmTokenizer>(std::move(vocab));
}

}  // namespace ember
