// The part shared by both tokenizer kinds: vocab validation, text -> id lookup, splitting the
// input around special tokens, token pieces of non-NORMAL tokens, end-of-generation ids.
#include "tokenizer/vocab.h"

#include <algorithm>

#include "ember/status.h"

namespace ember {

namespace {

void check_id(int32_t id, size_t n, const char* what) {
    if (id < -1 || id >= int64_t(n))
        fail("tokenizer: ", what, " id ", id, " is outside the vocabulary of ", n, " tokens");
}

// Texts that end a turn in the common chat formats (llama.cpp recognises the same set; Gemma 4 ends a
// turn with <turn|> and stops for a tool's response at <|tool_response>).
bool is_eog_text(const std::string& t) {
    // clang-format off: a list of texts, kept packed
    static const char* const texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
        "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>", "<turn|>", "<|tool_response>",
    };
    // clang-format on
    for (const char* s : texts)
        if (t == s) return true;
    return false;
}

}  // namespace

std::string spaces_from_marks(const std::string& piece) {
    std::string out;
    out.reserve(piece.size());
    for (size_t i = 0; i < piece.size();) {
        if (piece.compare(i, 3, k_space_mark) == 0) {
            out.push_back(' ');
            i += 3;
        } else {
            out.push_back(piece[i++]);
        }
    }
    return out;
}

int byte_token_value(const std::string& t) {
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int hi = hex(t[3]), lo = hex(t[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerVocab v) {
    const size_t n = v.tokens.size();
    if (n == 0) fail("tokenizer: tokenizer.ggml.tokens is empty");
    if (n > size_t(INT32_MAX)) fail("tokenizer: tokenizer.ggml.tokens has too many entries (", n, ")");
    if (!v.scores.empty() && v.scores.size() != n)
        fail("tokenizer: tokenizer.ggml.scores has ", v.scores.size(), " entries, expected ", n);
    if (!v.types.empty() && v.types.size() != n)
        fail("tokenizer: tokenizer.ggml.token_type has ", v.types.size(), " entries, expected ", n);
    for (size_t i = 0; i < v.types.size(); ++i)
        if (v.types[i] < 0 || v.types[i] > int32_t(TokenType::BYTE))
            fail("tokenizer: tokenizer.ggml.token_type[", i, "] = ", v.types[i], " is not a token type (0..6)");
    check_id(v.bos, n, "bos");
    check_id(v.eos, n, "eos");
    check_id(v.unk, n, "unknown");
    check_id(v.pad, n, "padding");
    check_id(v.eot, n, "eot");
    check_id(v.eom, n, "eom");
    check_id(v.sep, n, "separator");
    // Gemma 4's SentencePiece-style BPE: llama.cpp reads model "gemma4" as BPE with the gemma4
    // pre-tokenizer whatever tokenizer.ggml.pre says, and adds BOS with that pre-tokenizer always.
    if (v.model == "gemma4") v.pre = "gemma4";
    if ((v.model == "gpt2" || v.model == "gemma4") && (v.pre == "gemma4" || v.pre == "granite-embed-multi-311m"))
        v.add_bos = true;
    if (v.add_bos && v.bos < 0) fail("tokenizer: add_bos_token is set but there is no bos_token_id");
    if (v.add_eos && v.eos < 0) fail("tokenizer: add_eos_token is set but there is no eos_token_id");
    if (v.add_sep && v.sep < 0) fail("tokenizer: add_sep_token is set but there is no seperator_token_id");
    if (v.model == "gpt2" || v.model == "gemma4") return make_bpe_tokenizer(std::move(v));
    if (v.model == "llama") return make_spm_tokenizer(std::move(v));
    if (v.model == "bert") return make_wordpiece_tokenizer(std::move(v));
    if (v.model == "t5") return make_unigram_tokenizer(std::move(v));
    fail("tokenizer: tokenizer.ggml.model '", v.model,
         "' is not supported (expected 'gpt2', 'llama', 'bert', 't5' or 'gemma4')");
}

VocabTokenizer::VocabTokenizer(TokenizerVocab vocab) : v_(std::move(vocab)) {
    const int32_t n = int32_t(v_.tokens.size());
    token_ids_.reserve(size_t(n) * 2);
    for (int32_t i = 0; i < n; ++i) token_ids_[v_.tokens[i]] = i;   // later duplicates win

    for (int32_t i = 0; i < n; ++i) {
        TokenType t = type(i);
        if ((t == TokenType::CONTROL || t == TokenType::USER_DEFINED || t == TokenType::UNKNOWN) &&
            !v_.tokens[i].empty())
            special_.push_back(i);
    }
    // Longest first, so "<|im_start|>" wins over a shorter special token inside it.
    std::stable_sort(special_.begin(), special_.end(),
                     [&](int32_t a, int32_t b) { return v_.tokens[a].size() > v_.tokens[b].size(); });
    trie_rank_any_.assign(1, -1);
    trie_rank_user_.assign(1, -1);
    for (size_t rank = 0; rank < special_.size(); ++rank) {
        int32_t node = 0;
        for (unsigned char c : v_.tokens[special_[rank]]) {
            auto [it, added] = trie_child_.try_emplace(uint64_t(node) << 8 | c, int32_t(trie_rank_any_.size()));
            if (added) {
                trie_rank_any_.push_back(-1);
                trie_rank_user_.push_back(-1);
            }
            node = it->second;
        }
        if (trie_rank_any_[node] < 0) trie_rank_any_[node] = int32_t(rank);
        if (trie_rank_user_[node] < 0 && type(special_[rank]) == TokenType::USER_DEFINED)
            trie_rank_user_[node] = int32_t(rank);
    }

    eog_.assign(size_t(n), false);
    for (int32_t id : {v_.eos, v_.eot, v_.eom})
        if (id >= 0) eog_[id] = true;
    for (int32_t i = 0; i < n; ++i) {
        TokenType t = type(i);
        if ((t == TokenType::CONTROL || t == TokenType::USER_DEFINED) && is_eog_text(v_.tokens[i])) eog_[i] = true;
    }
}

std::vector<VocabTokenizer::SpecialMatch> VocabTokenizer::special_candidates(const std::string& text,
                                                                             bool parse_special) const {
    // One trie walk from each byte: the work is the text's length times the longest partial
    // match, never the text's length times the number of special tokens or of matches.
    std::vector<SpecialMatch> found;
    if (special_.empty()) return found;
    const std::vector<int32_t>& ranks = parse_special ? trie_rank_any_ : trie_rank_user_;
    for (size_t start = 0; start < text.size(); ++start) {
        int32_t node = 0;
        for (size_t i = start; i < text.size(); ++i) {
            auto it = trie_child_.find(uint64_t(node) << 8 | uint8_t(text[i]));
            if (it == trie_child_.end()) break;
            node = it->second;
            if (ranks[node] >= 0) found.push_back({uint32_t(ranks[node]), uint32_t(start)});
        }
    }
    return found;
}

std::vector<int32_t> VocabTokenizer::encode(const std::string& text, bool add_bos, bool parse_special) const {
    if (text.size() >= UINT32_MAX) fail("tokenizer: a text of ", text.size(), " bytes is too long to tokenize");
    // User-defined tokens are always matched (as llama.cpp and HF tokenizers do); control and
    // unknown tokens only when the caller asks to parse special text. Longest tokens claim their
    // places first, each token from left to right without overlapping what is claimed already
    // (llama.cpp's partitioning), which the candidates bucketed by rank reproduce in one pass.
    std::vector<SpecialMatch> found = special_candidates(text, parse_special);
    std::vector<uint32_t> bucket_end(special_.size() + 1, 0);
    for (const SpecialMatch& m : found) ++bucket_end[m.rank + 1];
    for (size_t r = 1; r < bucket_end.size(); ++r) bucket_end[r] += bucket_end[r - 1];
    std::vector<uint32_t> by_rank(found.size());
    {
        std::vector<uint32_t> next(bucket_end.begin(), bucket_end.end() - 1);
        for (const SpecialMatch& m : found) by_rank[next[m.rank]++] = m.pos;
    }
    // claimed[i]: 1 + the rank of the special token covering byte i, 0 for plain text.
    std::vector<uint32_t> claimed(found.empty() ? 0 : text.size(), 0);
    for (size_t rank = 0; rank < special_.size(); ++rank) {
        const size_t len = v_.tokens[special_[rank]].size();
        for (uint32_t k = bucket_end[rank]; k < bucket_end[rank + 1]; ++k) {
            const uint32_t pos = by_rank[k];
            if (std::any_of(&claimed[pos], &claimed[pos] + len, [](uint32_t c) { return c != 0; })) continue;
            std::fill(&claimed[pos], &claimed[pos] + len, uint32_t(rank + 1));
        }
    }

    // Fragments of the input: either a special token or a byte range of plain text.
    struct Fragment {
        int32_t token;   // -1: text[begin, end)
        size_t begin, end;
    };
    std::vector<Fragment> frags;
    for (size_t i = 0; i < text.size();) {
        if (claimed.empty() || claimed[i] == 0) {
            size_t end = i;
            while (end < text.size() && (claimed.empty() || claimed[end] == 0)) ++end;
            frags.push_back({-1, i, end});
            i = end;
        } else {
            const int32_t id = special_[claimed[i] - 1];
            frags.push_back({id, i, i + v_.tokens[id].size()});
            i += v_.tokens[id].size();
        }
    }

    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (add_bos && v_.add_bos) out.push_back(v_.bos);
    bool after_special = true;
    for (const Fragment& f : frags) {
        if (f.token >= 0) {
            out.push_back(f.token);
            after_special = true;
        } else if (f.end > f.begin) {
            encode_fragment(text.substr(f.begin, f.end - f.begin), after_special, out);
            after_special = false;
        }
    }
    // Like add_bos, EOS is added only where the model asks for it (and the caller adds specials).
    if (add_bos && v_.add_eos) out.push_back(v_.eos);
    // WordPiece ends with [SEP]; elsewhere add_sep only joins a pair's texts.
    if (add_bos && v_.add_sep && v_.model == "bert") out.push_back(v_.sep);
    return out;
}

std::string VocabTokenizer::token_to_piece(int32_t id, bool special) const {
    if (id < 0 || id >= n_vocab())
        fail("tokenizer: token id ", id, " is outside the vocabulary of ", n_vocab(), " tokens");
    switch (type(id)) {
        case TokenType::NORMAL: return normal_piece(id);
        case TokenType::CONTROL:
        case TokenType::UNKNOWN: return special ? v_.tokens[id] : std::string();
        case TokenType::USER_DEFINED: return v_.tokens[id];
        case TokenType::BYTE: {
            // "<0xNN>" -> the byte NN
            const std::string& t = v_.tokens[id];
            int b = byte_token_value(t);
            return b >= 0 ? std::string(1, char(b)) : t;
        }
        case TokenType::UNDEFINED:
        case TokenType::UNUSED: break;
    }
    return std::string();
}

bool VocabTokenizer::is_eog(int32_t id) const { return id >= 0 && id < n_vocab() && eog_[id]; }

const std::string& VocabTokenizer::token_text(int32_t id) const {
    if (id < 0 || id >= n_vocab())
        fail("tokenizer: token id ", id, " is outside the vocabulary of ", n_vocab(), " tokens");
    return v_.tokens[id];
}

std::vector<int32_t> VocabTokenizer::encode_plain(const std::string& text) const {
    std::vector<int32_t> out;
    encode_fragment(text, false, out);
    return out;
}

bool VocabTokenizer::is_special(int32_t id) const {
    const std::string& text = token_text(id);
    switch (type(id)) {
        case TokenType::NORMAL:
        case TokenType::BYTE: return false;
        case TokenType::USER_DEFINED: return text.size() > 2 && text.front() == '<' && text.back() == '>';
        default: return true;
    }
}

}  // namespace ember
