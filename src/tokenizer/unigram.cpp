// SentencePiece Unigram (tokenizer.ggml.model = "t5": XLM-RoBERTa, T5): the text normalized by the model's
// precompiled charsmap (longest-prefix replacements), spaces escaped to U+2581 (merged where
// remove_extra_whitespaces asks), then the pieces of highest total score (Viterbi), characters no piece
// covers becoming one unknown token per run.
#include <algorithm>
#include <cstring>
#include <limits>

#include "ember/status.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace ember {

namespace {

constexpr double k_unknown_penalty = 10.0;    // an unknown character scores the lowest piece's score less this

uint64_t fnv_step(uint64_t h, uint8_t c) { return (h ^ c) * 0x100000001B3ull; }
constexpr uint64_t k_fnv_basis = 0xCBF29CE484222325ull;

// Bytes of the well-formed UTF-8 character at s[i] (0 if it is malformed).
size_t valid_utf8_len(const std::string& s, size_t i) {
    const size_t len = utf8_len(uint8_t(s[i]));
    if (len == 1) return uint8_t(s[i]) < 0x80 ? 1 : 0;
    if (i + len > s.size()) return 0;
    for (size_t k = 1; k < len; ++k)
        if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return 0;
    return len;
}

class UnigramTokenizer final : public VocabTokenizer {
public:
    explicit UnigramTokenizer(TokenizerVocab vocab) : VocabTokenizer(std::move(vocab)) {
        if (v_.unk < 0) fail("tokenizer: a Unigram vocabulary needs an unknown token (unknown_token_id)");
        read_charsmap(v_.charsmap);
        double min_score = std::numeric_limits<double>::max();
        for (int32_t id = 0; id < n_vocab(); ++id) {
            const TokenType t = type(id);
            if (t == TokenType::NORMAL) min_score = std::min(min_score, double(score(id)));
            if (t != TokenType::NORMAL && t != TokenType::USER_DEFINED && t != TokenType::UNUSED) continue;
            uint64_t h = k_fnv_basis;
            for (unsigned char c : v_.tokens[id]) {
                h = fnv_step(h, c);
                prefixes_.push_back(h);
            }
            if (!v_.tokens[id].empty()) whole_.push_back({h, id});
        }
        unknown_score_ = (min_score == std::numeric_limits<double>::max() ? 0.0 : min_score) - k_unknown_penalty;
        std::sort(prefixes_.begin(), prefixes_.end());
        prefixes_.erase(std::unique(prefixes_.begin(), prefixes_.end()), prefixes_.end());
        // Of tokens spelled alike the later id wins, as in the text -> id lookup.
        std::stable_sort(whole_.begin(), whole_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }

    bool decode_strips_leading_space() const override { return v_.add_space_prefix; }

protected:
    void encode_fragment(const std::string& text, bool, std::vector<int32_t>& out) const override {
        const std::string s = normalize(text);
        const size_t n = s.size();
        if (n == 0) return;
        struct Best {
            int32_t id;
            size_t start;
            double score;
        };
        std::vector<Best> best(n + 1, {v_.unk, 0, -std::numeric_limits<double>::infinity()});
        best[0] = {v_.unk, 0, 0.0};
        for (size_t i = 0; i < n;) {
            const size_t char_len = std::min(utf8_len(uint8_t(s[i])), n - i);
            bool whole_char = false;
            uint64_t h = k_fnv_basis;
            for (size_t j = i; j < n; ++j) {
                h = fnv_step(h, uint8_t(s[j]));
                if (!std::binary_search(prefixes_.begin(), prefixes_.end(), h)) break;
                const int32_t id = token_of(h, s, i, j + 1);
                if (id < 0) continue;
                whole_char |= j + 1 - i == char_len;
                const double cand = best[i].score + (type(id) == TokenType::USER_DEFINED ? 0.0 : score(id));
                if (cand > best[j + 1].score) best[j + 1] = {id, i, cand};
            }
            if (!whole_char) {
                const double cand = best[i].score + unknown_score_;
                if (cand > best[i + char_len].score) best[i + char_len] = {v_.unk, i, cand};
            }
            i += char_len;
        }
        const size_t first = out.size();
        bool prev_unknown = false;
        for (size_t end = n;;) {
            const Best& b = best[end];
            const bool unknown = b.id == v_.unk;
            if (!(prev_unknown && unknown)) out.push_back(b.id);   // a run of unknowns is one token
            prev_unknown = unknown;
            if (b.start == 0) break;
            end = b.start;
        }
        std::reverse(out.begin() + std::ptrdiff_t(first), out.end());
    }

    std::string normal_piece(int32_t id) const override {
        const std::string& t = v_.tokens[id];
        return spaces_from_marks(t);
    }

private:
    float score(int32_t id) const { return v_.scores.empty() ? 0.0f : v_.scores[id]; }

    int32_t token_of(uint64_t h, const std::string& s, size_t begin, size_t end) const {
        auto it = std::lower_bound(whole_.begin(), whole_.end(), h,
                                   [](const auto& e, uint64_t v) { return e.first < v; });
        int32_t id = -1;
        for (; it != whole_.end() && it->first == h; ++it)
            if (v_.tokens[it->second].compare(0, std::string::npos, s, begin, end - begin) == 0) id = it->second;
        return id;
    }

    // The charsmap as sentencepiece stores it: a uint32 byte count, a double array of that many bytes
    // (XOR-compressed: BASE in bits 10-30, shifted by bit 9; LCHECK in bits 0-7 and 31; LEAF in bit 8; a
    // leaf's value is an offset into the replacements), then NUL-terminated replacement strings.
    void read_charsmap(const std::string& map) {
        if (map.empty()) return;
        if (map.size() < 4) fail("tokenizer: precompiled_charsmap has ", map.size(), " bytes, fewer than its header");
        uint32_t blob = 0;
        std::memcpy(&blob, map.data(), 4);
        if (blob % 4 != 0 || size_t(blob) > map.size() - 4)
            fail("tokenizer: precompiled_charsmap's double array of ", blob, " bytes does not fit its ", map.size(),
                 " bytes");
        xcda_.resize(blob / 4);
        std::memcpy(xcda_.data(), map.data() + 4, blob);
        replacements_ = map.substr(4 + size_t(blob));
        if (xcda_.empty()) fail("tokenizer: precompiled_charsmap's double array is empty");
    }

    uint32_t unit(size_t i) const {
        if (i >= xcda_.size()) fail("tokenizer: precompiled_charsmap's double array is malformed (index ", i, ")");
        return xcda_[i];
    }
    static uint32_t base(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

    // The replacement of the longest charsmap entry text[pos...] starts with, and the bytes it covers.
    size_t charsmap_match(const std::string& text, size_t pos, std::string& replacement) const {
        if (xcda_.empty()) return 0;
        size_t matched = 0;
        uint32_t value = 0;
        uint32_t node = base(unit(0));
        for (size_t i = pos; i < text.size(); ++i) {
            const uint8_t c = uint8_t(text[i]);
            if (c == 0) break;
            node ^= c;
            const uint32_t u = unit(node);
            if ((u & ((1u << 31) | 0xFF)) != c) break;
            node ^= base(u);
            if ((u >> 8) & 1) {
                matched = i - pos + 1;
                value = unit(node) & ((1u << 31) - 1);
            }
        }
        if (matched == 0) return 0;
        const size_t end = replacements_.find('\0', value);
        if (value >= replacements_.size() || end == std::string::npos)
            fail("tokenizer: precompiled_charsmap's replacement at ", value, " is outside its strings");
        replacement = replacements_.substr(value, end - value);
        return matched;
    }

    // sentencepiece's normalizer: charsmap replacements, then spaces escaped (and merged, a U+2581 before
    // each word, where remove_extra_whitespaces asks), a U+2581 before the text where add_space_prefix asks.
    std::string normalize(const std::string& text) const {
        std::string out, piece;
        out.reserve(text.size() * 3 / 2 + 3);
        const bool merge = v_.remove_extra_whitespaces;
        bool prepended = false, in_word = false;
        for (size_t pos = 0; pos < text.size();) {
            size_t used = charsmap_match(text, pos, piece);
            if (used == 0) {
                used = valid_utf8_len(text, pos);
                piece = used ? text.substr(pos, used) : std::string("\xEF\xBF\xBD");
                used = std::max<size_t>(used, 1);
            }
            for (size_t i = 0; i < piece.size();) {
                // Merging splits words at any Unicode whitespace (HF's WhitespaceSplit), else at ' ' only.
                const size_t len = std::max<size_t>(valid_utf8_len(piece, i), 1);
                bool space = piece[i] == ' ';
                if (merge && !space && len > 1) {
                    std::vector<uint32_t> cpts;
                    std::vector<size_t> offsets;
                    utf8_decode(piece.substr(i, len), cpts, offsets);
                    space = codepoint_flags(cpts[0]) & CPT_WHITESPACE;
                }
                if (!space) {
                    if (!in_word) {
                        in_word = true;
                        if ((v_.add_space_prefix && !prepended) || merge) {
                            out += k_space_mark;
                            prepended = true;
                        }
                    }
                    out.append(piece, i, len);
                } else {
                    in_word = false;
                    if (!merge) out += k_space_mark;
                }
                i += len;
            }
            pos += used;
        }
        return out;
    }

    std::vector<uint32_t> xcda_;
    std::string replacements_;
    std::vector<uint64_t> prefixes_;                    // FNV-1a hashes of every prefix of a matchable piece
    std::vector<std::pair<uint64_t, int32_t>> whole_;   // (hash of the whole piece, id), by hash
    double unknown_score_ = 0.0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_unigram_tokenizer(TokenizerVocab vocab) {
    return std::make_unique<UnigramTokenizer>(std::move(vocab));
}

}  // namespace ember
