// Hand-written pre-tokenizer regexes. Each stage refines a list of codepoint ranges [begin, end)
// of the text; a match never crosses a range boundary, as when llama.cpp applies its regex
// chain piece by piece. Semantics follow leftmost-alternative regex matching.
#include "tokenizer/pretokenize.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "ember/status.h"
#include "tokenizer/unicode.h"

namespace ember {

namespace {

struct Range {
    size_t begin, end;
};

// One pre-tokenization: the decoded text and the current list of pieces.
class Splitter {
public:
    explicit Splitter(const std::string& text) : text_(text) {
        utf8_decode(text, cpts_, offsets_);
        flags_.resize(cpts_.size());
        for (size_t i = 0; i < cpts_.size(); ++i) flags_[i] = codepoint_flags(cpts_[i]);
        if (!cpts_.empty()) pieces_.push_back({0, cpts_.size()});
    }

    // Matches of `match_len` (0 = no match at this position) become pieces; the text between
    // matches becomes pieces too.
    template <class MatchLen>
    void split_matches(MatchLen match_len) {
        std::vector<Range> out;
        out.reserve(pieces_.size() * 2);
        for (const Range& r : pieces_) {
            size_t gap = r.begin, pos = r.begin;
            while (pos < r.end) {
                size_t n = match_len(pos, r.end);
                if (n == 0) {
                    ++pos;
                    continue;
                }
                if (pos > gap) out.push_back({gap, pos});
                out.push_back({pos, pos + n});
                pos += n;
                gap = pos;
            }
            if (r.end > gap) out.push_back({gap, r.end});
        }
        pieces_.swap(out);
    }

    // The GPT-2 pattern. Every codepoint is covered by some alternative, so the piece is
    // cut into consecutive words.
    void split_gpt2() {
        split_words([&](size_t pos, size_t end) -> size_t {
            const uint32_t c = cpts_[pos];
            if (size_t n = contraction(pos, end, false)) return pos + n;
            const bool sp = c == ' ' && pos + 1 < end;   // the optional leading space
            const uint8_t f = flags_[sp ? pos + 1 : pos];
            if (f & CPT_LETTER) return run(pos + sp, end, CPT_LETTER);
            if (f & CPT_NUMBER) return run(pos + sp, end, CPT_NUMBER);
            if (!(f & (CPT_WHITESPACE | CPT_LETTER | CPT_NUMBER)))
                return run_not(pos + sp, end, CPT_WHITESPACE | CPT_LETTER | CPT_NUMBER);
            return whitespace_end(pos, end, false);
        });
    }

    // The llama3 pattern; max_digits is 3 for llama3, 1 for qwen2.
    void split_llama3(size_t max_digits) {
        split_words([&](size_t pos, size_t end) -> size_t {
            const uint32_t c = cpts_[pos];
            const uint8_t f = flags_[pos];
            if (size_t n = contraction(pos, end, true)) return pos + n;
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if (!(c == '\r' || c == '\n' || (f & CPT_NUMBER)) &&
                ((f & CPT_LETTER) || (pos + 1 < end && (flags_[pos + 1] & CPT_LETTER))))
                return run(pos + 1, end, CPT_LETTER);
            // \p{N}{1,max_digits}
            if (f & CPT_NUMBER) {
                size_t e = pos;
                while (e < end && e - pos < max_digits && (flags_[e] & CPT_NUMBER)) ++e;
                return e;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            const bool sp = c == ' ' && pos + 1 < end;
            const uint8_t f2 = flags_[sp ? pos + 1 : pos];
            if (!(f2 & (CPT_WHITESPACE | CPT_LETTER | CPT_NUMBER))) {
                size_t e = run_not(pos + sp, end, CPT_WHITESPACE | CPT_LETTER | CPT_NUMBER);
                while (e < end && (cpts_[e] == '\r' || cpts_[e] == '\n')) ++e;
                return e;
            }
            return whitespace_end(pos, end, true);
        });
    }

    // Mistral's tekken and OpenAI's gpt-4o patterns (pretokenize.h): case-aware letter runs (gpt-4o's
    // with a contraction after them), digits (max_digits at a time), punctuation with trailing
    // newlines or slashes, then llama3's whitespace rules.
    void split_cased(bool contractions, size_t max_digits) {
        // U: upper, titlecase, modifier and other letters, and marks; L: lower, modifier and other
        // letters, and marks (Lm, Lo and M are in both).
        auto in_u = [&](size_t i) {
            return (flags_[i] & CPT_MARK) || ((flags_[i] & CPT_LETTER) && !(flags_[i] & CPT_LOWER));
        };
        auto in_l = [&](size_t i) {
            return (flags_[i] & CPT_MARK) || ((flags_[i] & CPT_LETTER) && !(flags_[i] & CPT_UPPER));
        };
        auto prefix_ok = [&](size_t i) {
            return cpts_[i] != '\r' && cpts_[i] != '\n' && !(flags_[i] & (CPT_LETTER | CPT_NUMBER));
        };
        split_words([&](size_t pos, size_t end) -> size_t {
            // The first two alternatives, with the optional prefix taken when it can be (greedy ?).
            for (int alt = 0; alt < 2; ++alt)
                for (size_t pre = (prefix_ok(pos) ? 1 : 0);; --pre) {
                    const size_t s = pos + pre;
                    size_t m = s;   // U* / U+ takes all it can, then gives back for L+
                    while (m < end && in_u(m)) ++m;
                    size_t e = 0;
                    if (alt == 0) {
                        for (size_t k = m + 1; k-- > s && !e;)
                            if (k < end && in_l(k)) {
                                e = k;
                                while (e < end && in_l(e)) ++e;
                            }
                    } else if (m > s) {
                        e = m;
                        while (e < end && in_l(e)) ++e;
                    }
                    if (e) return contractions && e < end ? e + contraction(e, end, true) : e;
                    if (pre == 0) break;
                }
            if (flags_[pos] & CPT_NUMBER) {
                size_t e = pos;
                while (e < end && e - pos < max_digits && (flags_[e] & CPT_NUMBER)) ++e;
                return e;
            }
            const bool sp = cpts_[pos] == ' ' && pos + 1 < end;
            if (!(flags_[sp ? pos + 1 : pos] & (CPT_WHITESPACE | CPT_LETTER | CPT_NUMBER))) {
                size_t e = run_not(pos + sp, end, CPT_WHITESPACE | CPT_LETTER | CPT_NUMBER);
                while (e < end && (cpts_[e] == '\r' || cpts_[e] == '\n' || cpts_[e] == '/')) ++e;
                return e;
            }
            return whitespace_end(pos, end, true);
        });
    }

    // Cuts every piece into consecutive words: next_word(pos, piece_end) gives the end of the
    // word starting at pos (each pattern covers every codepoint with some alternative).
    template <class NextWord>
    void split_words(NextWord&& next_word) {
        std::vector<Range> out;
        out.reserve(pieces_.size() * 2);
        for (const Range& r : pieces_)
            for (size_t pos = r.begin; pos < r.end;) {
                const size_t end = next_word(pos, r.end);
                out.push_back({pos, end});
                pos = end;
            }
        pieces_.swap(out);
    }

    std::vector<std::string> words() const {
        std::vector<std::string> w;
        w.reserve(pieces_.size());
        for (const Range& r : pieces_) w.emplace_back(text_, offsets_[r.begin], offsets_[r.end] - offsets_[r.begin]);
        return w;
    }

    const std::vector<uint32_t>& cpts() const { return cpts_; }
    const std::vector<uint8_t>& flags() const { return flags_; }

private:
    // 's|'t|'re|'ve|'m|'ll|'d (optionally case-insensitive): length matched, or 0.
    size_t contraction(size_t pos, size_t end, bool any_case) const {
        if (cpts_[pos] != '\'' || pos + 1 >= end) return 0;
        auto lower = [&](size_t i) -> uint32_t {
            uint32_t c = cpts_[i];
            return (any_case && c >= 'A' && c <= 'Z') ? c + 32 : c;
        };
        const uint32_t a = lower(pos + 1);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (pos + 2 >= end) return 0;
        const uint32_t b = lower(pos + 2);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
        return 0;
    }

    size_t run(size_t pos, size_t end, uint8_t mask) const {
        while (pos < end && (flags_[pos] & mask)) ++pos;
        return pos;
    }
    size_t run_not(size_t pos, size_t end, uint8_t mask) const {
        while (pos < end && !(flags_[pos] & mask)) ++pos;
        return pos;
    }

    // At a codepoint no earlier alternative matched: \s*[\r\n]+ (llama3 only), \s+(?!\S), \s+,
    // or a lone codepoint when nothing matches at all.
    size_t whitespace_end(size_t pos, size_t end, bool newline_rule) const {
        size_t n = 0, last_newline_end = 0;
        while (pos + n < end && (flags_[pos + n] & CPT_WHITESPACE)) {
            if (cpts_[pos + n] == '\r' || cpts_[pos + n] == '\n') last_newline_end = pos + n + 1;
            ++n;
        }
        if (newline_rule && last_newline_end) return last_newline_end;
        if (n > 1 && pos + n < end) return pos + n - 1;   // leave one space for the next word
        if (n > 0) return pos + n;
        return pos + 1;
    }

    const std::string& text_;
    std::vector<uint32_t> cpts_;
    std::vector<size_t> offsets_;
    std::vector<uint8_t> flags_;
    std::vector<Range> pieces_;
};

bool is_ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }

}  // namespace

PreTokenizer pre_tokenizer_from_name(const std::string& name) {
    static const std::unordered_map<std::string, PreTokenizer> names = {
        {"gpt-2", PreTokenizer::GPT2},
        {"gpt2", PreTokenizer::GPT2},
        {"mpt", PreTokenizer::GPT2},
        {"olmo", PreTokenizer::GPT2},
        {"jais", PreTokenizer::GPT2},
        {"phi-2", PreTokenizer::GPT2},
        {"smollm", PreTokenizer::SMOLLM},
        {"starcoder", PreTokenizer::SMOLLM},
        {"refact", PreTokenizer::SMOLLM},
        {"command-r", PreTokenizer::SMOLLM},
        {"codeshell", PreTokenizer::SMOLLM},
        {"exaone", PreTokenizer::SMOLLM},
        {"minerva-7b", PreTokenizer::SMOLLM},
        {"llama3", PreTokenizer::LLAMA3},
        {"llama-v3", PreTokenizer::LLAMA3},
        {"llama-bpe", PreTokenizer::LLAMA3},
        {"falcon3", PreTokenizer::LLAMA3},
        {"dbrx", PreTokenizer::LLAMA3},
        {"smaug-bpe", PreTokenizer::LLAMA3},
        {"chatglm-bpe", PreTokenizer::LLAMA3},
        {"qwen2", PreTokenizer::QWEN2},
        {"stablelm2", PreTokenizer::QWEN2},
        {"deepseek-r1-qwen", PreTokenizer::QWEN2},
        {"hunyuan", PreTokenizer::QWEN2},
        {"tekken", PreTokenizer::TEKKEN},
        {"gpt-4o", PreTokenizer::GPT4O},
        {"llama4", PreTokenizer::GPT4O},
        {"glm4", PreTokenizer::LLAMA3},
        {"default", PreTokenizer::DEFAULT},
        {"gemma4", PreTokenizer::GEMMA4},
        {"granite-embed-multi-311m", PreTokenizer::GEMMA4},
    };
    auto it = names.find(name);
    if (it == names.end()) {
        std::vector<std::string> known;
        for (const auto& [n, kind] : names) known.push_back(n);
        std::sort(known.begin(), known.end());
        std::string list;
        for (const std::string& n : known) list += (list.empty() ? "" : ", ") + n;
        fail("tokenizer: unknown pre-tokenizer '", name, "' (tokenizer.ggml.pre); ember splits text as: ", list);
    }
    return it->second;
}

std::vector<std::string> pre_tokenize(PreTokenizer kind, const std::string& text) {
    Splitter s(text);
    const auto& cpts = s.cpts();
    const auto& flags = s.flags();
    switch (kind) {
        case PreTokenizer::GPT2: s.split_gpt2(); break;
        case PreTokenizer::SMOLLM:
            s.split_matches([&](size_t pos, size_t) -> size_t { return (flags[pos] & CPT_NUMBER) ? 1 : 0; });
            s.split_gpt2();
            break;
        case PreTokenizer::LLAMA3: s.split_llama3(3); break;
        case PreTokenizer::QWEN2: s.split_llama3(1); break;
        case PreTokenizer::TEKKEN: s.split_cased(false, 1); break;
        case PreTokenizer::GPT4O: s.split_cased(true, 3); break;
        case PreTokenizer::GEMMA4:
            s.split_matches([&](size_t pos, size_t end) -> size_t {
                size_t e = pos;
                while (e < end && cpts[e] == '\n') ++e;
                return e - pos;
            });
            break;
        case PreTokenizer::DEFAULT: {
            auto is_punct = [&](size_t i) {
                const uint32_t c = cpts[i];
                return (flags[i] & CPT_PUNCT) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
                       c == '~' || c == '|';
            };
            s.split_matches([&](size_t pos, size_t end) -> size_t {
                size_t e = pos;
                while (e < end && is_punct(e)) ++e;
                return e - pos;
            });
            s.split_gpt2();
            s.split_matches([&](size_t pos, size_t end) -> size_t {
                size_t e = pos;
                while (e < end && (flags[e] & CPT_NUMBER)) ++e;
                return e - pos;
            });
            s.split_matches([&](size_t pos, size_t end) -> size_t {
                return (pos + 3 <= end && is_ascii_digit(cpts[pos]) && is_ascii_digit(cpts[pos + 1]) &&
                        is_ascii_digit(cpts[pos + 2]))
                           ? 3
                           : 0;
            });
            break;
        }
    }
    return s.words();
}

}  // namespace ember
