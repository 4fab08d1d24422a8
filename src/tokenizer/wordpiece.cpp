// WordPiece (tokenizer.ggml.model = "bert"): BERT's normalizer (clean text, CJK characters apart, accents
// stripped after NFD, lowercase, as the file's normalizer keys say), its pre-tokenizer (whitespace,
// punctuation alone) and greedy longest-match pieces over the vocab in llama.cpp's "phantom space" form.
#include <algorithm>

#include "tokenizer/bert_tables.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace ember {

namespace {

const char k_word_start[] = "\xE2\x96\x81";   // U+2581: a word-start piece's prefix in the GGUF vocab
constexpr size_t k_max_word_chars = 100;      // longer words are one unknown token (HF's max_input_chars_per_word)

bool in_ranges(const CodepointRange* rs, size_t n, uint32_t cp) {
    auto it = std::upper_bound(rs, rs + n, cp, [](uint32_t v, const CodepointRange& r) { return v < r.first; });
    return it != rs && cp <= (it - 1)->last;
}

bool append_mapped(const CodepointMapping* ms, size_t n, const uint32_t* cpts, uint32_t cp,
                   std::vector<uint32_t>& out) {
    auto it = std::lower_bound(ms, ms + n, cp, [](const CodepointMapping& m, uint32_t v) { return m.cp < v; });
    if (it == ms + n || it->cp != cp) return false;
    out.insert(out.end(), cpts + it->offset, cpts + it->offset + it->len);
    return true;
}

// The ideograph blocks BERT sets apart as words of their own (the ranges HF tokenizers checks).
bool is_cjk(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

bool is_bert_punctuation(uint32_t cp) {
    const bool ascii = (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
                       (cp >= 123 && cp <= 126);
    return ascii || (codepoint_flags(cp) & CPT_PUNCT);
}

class WordPieceTokenizer final : public VocabTokenizer {
public:
    explicit WordPieceTokenizer(TokenizerVocab vocab) : VocabTokenizer(std::move(vocab)) {
        for (const std::string& t : v_.tokens) max_token_bytes_ = std::max(max_token_bytes_, t.size());
    }

    bool decode_strips_leading_space() const override { return true; }

protected:
    void encode_fragment(const std::string& text, bool, std::vector<int32_t>& out) const override {
        std::vector<uint32_t> cpts, mapped, lowered, word;
        std::vector<size_t> offsets;
        utf8_decode(text, cpts, offsets);
        auto end_word = [&] {
            if (!word.empty()) encode_word(word, out);
            word.clear();
        };
        for (uint32_t cp : cpts) {
            // clean_text: NUL, U+FFFD, malformed bytes and the C* categories go; whitespace splits.
            if (cp == 9 || cp == 10 || cp == 13) {
                end_word();
                continue;
            }
            if (cp == 0 || cp == 0xFFFD || cp >= k_invalid_cpt || is_other_category(cp)) continue;
            if (codepoint_flags(cp) & CPT_WHITESPACE) {
                end_word();
                continue;
            }
            const bool cjk = is_cjk(cp);
            mapped.clear();
            if (v_.strip_accents) {
                std::vector<uint32_t> nfd;
                append_nfd(cp, nfd);
                for (uint32_t c : nfd)
                    if (!is_nonspacing_mark(c)) mapped.push_back(c);
            } else {
                mapped.push_back(cp);
            }
            lowered.clear();
            for (uint32_t c : mapped) {
                if (v_.lowercase) append_lower(c, lowered);
                else lowered.push_back(c);
            }
            if (cjk) end_word();
            for (uint32_t c : lowered) {
                if (is_bert_punctuation(c)) {
                    end_word();
                    word.push_back(c);
                    end_word();
                } else {
                    word.push_back(c);
                }
            }
            if (cjk) end_word();
        }
        end_word();
    }

    std::string normal_piece(int32_t id) const override {
        const std::string& t = v_.tokens[id];
        if (t.compare(0, 3, k_word_start) == 0) return " " + t.substr(3);
        return t;
    }

private:
    // Greedy longest match from the word's start; a place no piece matches makes the whole word unknown.
    void encode_word(const std::vector<uint32_t>& word, std::vector<int32_t>& out) const {
        const size_t first_out = out.size();
        if (word.size() <= k_max_word_chars) {
            std::string text = k_word_start;
            std::vector<size_t> ends;   // byte offset in text after each character
            for (uint32_t c : word) {
                utf8_append(text, c);
                ends.push_back(text.size());
            }
            size_t start = 0, start_char = 0;
            while (start_char < word.size()) {
                int32_t id = -1;
                size_t end_char = word.size();
                for (; end_char > start_char; --end_char) {
                    if (ends[end_char - 1] - start > max_token_bytes_) continue;
                    id = find_token(text.substr(start, ends[end_char - 1] - start));
                    if (id >= 0) break;
                }
                if (id < 0) break;
                out.push_back(id);
                start = ends[end_char - 1];
                start_char = end_char;
            }
            if (start_char == word.size()) return;
        }
        out.resize(first_out);
        if (v_.unk >= 0) out.push_back(v_.unk);
    }

    size_t max_token_bytes_ = 0;
};

}  // namespace

bool is_other_category(uint32_t cp) { return in_ranges(k_other_ranges, k_other_ranges_count, cp); }

bool is_nonspacing_mark(uint32_t cp) { return in_ranges(k_nonspacing_mark_ranges, k_nonspacing_mark_ranges_count, cp); }

void append_nfd(uint32_t cp, std::vector<uint32_t>& out) {
    // Hangul syllables decompose by arithmetic (Unicode's conjoining jamo algorithm).
    constexpr uint32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
    constexpr uint32_t v_count = 21, t_count = 28, s_count = 19 * v_count * t_count;
    if (cp >= s_base && cp < s_base + s_count) {
        const uint32_t s = cp - s_base;
        out.push_back(l_base + s / (v_count * t_count));
        out.push_back(v_base + (s % (v_count * t_count)) / t_count);
        if (s % t_count) out.push_back(t_base + s % t_count);
        return;
    }
    if (!append_mapped(k_nfd, k_nfd_count, k_nfd_cpts, cp, out)) out.push_back(cp);
}

void append_lower(uint32_t cp, std::vector<uint32_t>& out) {
    if (!append_mapped(k_lower, k_lower_count, k_lower_cpts, cp, out)) out.push_back(cp);
}

std::unique_ptr<Tokenizer> make_wordpiece_tokenizer(TokenizerVocab vocab) {
    return std::make_unique<WordPieceTokenizer>(std::move(vocab));
}

}  // namespace ember
