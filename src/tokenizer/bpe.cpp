// Byte-level BPE (tokenizer.ggml.model = "gpt2"): pre-tokenize by tokenizer.ggml.pre, map each
// word's bytes to GPT-2's printable codepoints, merge adjacent symbols by merge rank. Gemma 4's
// SentencePiece-style BPE (model "gemma4", or pre "gemma4"): spaces become U+2581, merges run by rank
// over the raw UTF-8 of each line, what is not a token falls back to <0xNN> byte tokens.
#include <algorithm>
#include <mutex>

#include "ember/status.h"
#include "tokenizer/symbol_merge.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace ember {

namespace {

class BpeTokenizer final : public VocabTokenizer {
public:
    explicit BpeTokenizer(TokenizerVocab vocab)
        : VocabTokenizer(std::move(vocab)), pre_(pre_tokenizer_from_name(v_.pre)) {
        // llama3-style and tekken vocabularies take a word that is itself a token as is (HF
        // ignore_merges; llama.cpp sets it for both).
        ignore_merges_ = pre_ == PreTokenizer::LLAMA3 || pre_ == PreTokenizer::TEKKEN;
        spm_style_ = pre_ == PreTokenizer::GEMMA4;
        for (int b = 0; b < 256; ++b) {
            const char name[7] = {'<', '0', 'x', "0123456789ABCDEF"[b >> 4], "0123456789ABCDEF"[b & 15], '>', 0};
            byte_ids_[b] = find_token(name);
        }
        if (spm_style_ && find_token(std::string(k_space_mark) + k_space_mark) >= 0) {
            std::string run;
            for (size_t len = 1; len <= k_max_run; ++len) mark_run_ids_.push_back(find_token(run += k_space_mark));
            mark_run_ids_[0] = -1;   // one mark is no run: it stays with the text
            while (mark_run_ids_.back() < 0) mark_run_ids_.pop_back();
        }
        if (spm_style_ && find_token("\n") >= 0) {
            for (size_t len = 1; len <= k_max_run; ++len) newline_ids_.push_back(find_token(std::string(len, '\n')));
            while (newline_ids_.back() < 0) newline_ids_.pop_back();
        }
        ranks_.reserve(v_.merges.size() * 2);
        for (size_t i = 0; i < v_.merges.size(); ++i) {
            const std::string& m = v_.merges[i];
            // The separator is the first space after the first character (a merge side is never empty).
            size_t sp = m.find(' ', 1);
            if (sp == std::string::npos || sp + 1 >= m.size())
                fail("tokenizer: tokenizer.ggml.merges[", i, "] = '", m, "' is not 'left right'");
            ranks_.emplace(m, int32_t(i));   // the first rank of a repeated merge counts
        }
    }

protected:
    void encode_fragment(const std::string& text, bool, std::vector<int32_t>& out) const override {
        const std::string input = replace_invalid_utf8(text);
        if (!spm_style_) return encode_words(input, out);
        // Runs of U+2581 typed in the text are SentencePiece's user-defined pieces, which HF's tokenizer
        // splits off the raw text as added tokens (the longest from the left) before spaces become U+2581.
        size_t seg = 0, i = 0;
        while (i < input.size()) {
            size_t n = 0;
            while (!mark_run_ids_.empty() && i + 3 * n + 3 <= input.size() &&
                   input.compare(i + 3 * n, 3, k_space_mark) == 0)
                ++n;
            if (n < 2) {
                i += n ? 3 : 1;
                continue;
            }
            encode_words(escape_spaces(input.substr(seg, i - seg)), out);
            size_t left = n;
            while (left >= 2) {
                size_t k = std::min(left, mark_run_ids_.size());
                while (k >= 2 && mark_run_ids_[k - 1] < 0) --k;
                if (k < 2) break;
                out.push_back(mark_run_ids_[k - 1]);
                left -= k;
            }
            i += 3 * n;
            seg = i - 3 * left;   // a mark left over joins the text after it
        }
        encode_words(escape_spaces(input.substr(seg)), out);
    }

    // Pre-tokenizes input (valid UTF-8, spaces already U+2581 in Gemma 4's BPE) and merges each word.
    void encode_words(const std::string& input, std::vector<int32_t>& out) const {
        std::string encoded;
        for (const std::string& word : pre_tokenize(pre_, input)) {
            if (spm_style_ && word[0] == '\n' && newline_run(word, out)) continue;
            encoded.clear();
            if (spm_style_) encoded = word;
            else
                for (unsigned char b : word) encoded += byte_to_unicode(b);
            {
                std::lock_guard<std::mutex> lock(cache_mutex_);
                auto it = cache_.find(encoded);
                if (it != cache_.end()) {
                    out.insert(out.end(), it->second.begin(), it->second.end());
                    continue;
                }
            }
            std::vector<int32_t> ids = bpe(encoded);
            out.insert(out.end(), ids.begin(), ids.end());
            if (encoded.size() > k_cache_word_bytes) continue;   // a whole line of Gemma 4's, seldom seen twice
            std::lock_guard<std::mutex> lock(cache_mutex_);
            if (cache_.size() >= k_cache_limit) cache_.clear();   // bounded memory on odd inputs
            cache_.emplace(encoded, std::move(ids));
        }
    }

    std::string normal_piece(int32_t id) const override {
        const std::string& t = v_.tokens[id];
        if (spm_style_) return spaces_from_marks(t);
        // Undo the byte -> codepoint mapping; a codepoint outside the map is kept as UTF-8.
        std::vector<uint32_t> cpts;
        std::vector<size_t> offsets;
        utf8_decode(t, cpts, offsets);
        std::string out;
        out.reserve(t.size());
        for (uint32_t cp : cpts) {
            int b = unicode_to_byte(cp);
            if (b >= 0) out.push_back(char(b));
            else utf8_append(out, cp);
        }
        return out;
    }

private:
    static constexpr size_t k_cache_limit = 1 << 16;
    static constexpr size_t k_cache_word_bytes = 256;   // longer words are not cached
    static constexpr size_t k_max_run = 256;   // longer runs of newlines or marks are not looked for

    static std::string escape_spaces(const std::string& text) {
        std::string s;
        s.reserve(text.size() + text.size() / 4);
        for (char c : text) {
            if (c == ' ') s += k_space_mark;
            else s.push_back(c);
        }
        return s;
    }

    // A run of newlines as the longest newline tokens from the left: HF's tokenizer splits them off as
    // added tokens (SentencePiece's user-defined pieces) before any merge; llama.cpp takes a run that is
    // a token whole, the same on every run no longer than the longest such token. False where "\n" is
    // no token (the run goes through the merges).
    bool newline_run(const std::string& word, std::vector<int32_t>& out) const {
        if (newline_ids_.empty()) return false;
        for (size_t at = 0; at < word.size();) {
            size_t len = std::min(newline_ids_.size(), word.size() - at);
            while (newline_ids_[len - 1] < 0) --len;
            out.push_back(newline_ids_[len - 1]);
            at += len;
        }
        return true;
    }

    // A symbol that is no token: each character that is one, else its bytes' <0xNN> tokens where all
    // exist (HF's byte fallback), else unknown.
    void fall_back(const std::string& word, size_t start, size_t len, std::vector<int32_t>& ids) const {
        for (size_t k = start; k < start + len;) {
            const size_t n = std::min(utf8_len(uint8_t(word[k])), start + len - k);
            const int32_t cid = find_token(word.substr(k, n));
            bool bytes = spm_style_ && cid < 0;
            for (size_t j = k; bytes && j < k + n; ++j) bytes = byte_ids_[uint8_t(word[j])] >= 0;
            if (cid >= 0) ids.push_back(cid);
            else if (bytes)
                for (size_t j = k; j < k + n; ++j) ids.push_back(byte_ids_[uint8_t(word[j])]);
            // Unknown characters in a row are one unknown token (HF's fuse_unk) in Gemma 4's BPE.
            else if (v_.unk >= 0 && !(spm_style_ && !ids.empty() && ids.back() == v_.unk)) ids.push_back(v_.unk);
            k += n;
        }
    }

    int32_t rank(const std::string& word, size_t a, size_t alen, size_t blen, std::string& key) const {
        key.assign(word, a, alen);
        key += ' ';
        key.append(word, a + alen, blen);
        auto it = ranks_.find(key);
        return it == ranks_.end() ? -1 : it->second;
    }

    // Merges the symbols (initially one per codepoint) of an encoded word, always taking the
    // lowest-ranked adjacent pair (leftmost on ties). A doubly linked list plus a heap of
    // candidate pairs keeps long words (whitespace runs, long numbers) near O(n log n).
    std::vector<int32_t> bpe(const std::string& word) const {
        std::vector<int32_t> ids;
        if (word.empty()) return ids;
        if (ignore_merges_) {
            int32_t id = find_token(word);
            if (id >= 0) return {id};
        }
        std::vector<MergeSymbol> syms = split_characters(word);
        std::string key;
        // Lower merge rank merges first.
        merge_symbols(syms, [&](const MergeSymbol& l, const MergeSymbol& r, double& priority) {
            const int32_t rk = rank(word, l.start, l.len, r.len, key);
            priority = -double(rk);
            return rk >= 0;
        });

        for (int i = 0; i >= 0; i = syms[i].next) {
            const MergeSymbol& s = syms[i];
            int32_t id = find_token(word.substr(s.start, s.len));
            if (id >= 0) {
                ids.push_back(id);
                continue;
            }
            fall_back(word, s.start, s.len, ids);
        }
        return ids;
    }

    PreTokenizer pre_;
    bool ignore_merges_ = false;
    bool spm_style_ = false;        // Gemma 4's: U+2581 for spaces, raw UTF-8, <0xNN> byte fallback
    int32_t byte_ids_[256];         // byte -> <0xNN> token, -1 if none
    std::vector<int32_t> mark_run_ids_;  // [n - 1]: the token of n U+2581 (n >= 2), -1 if none; empty: none
    std::vector<int32_t> newline_ids_;   // [n - 1]: the token of n newlines, -1 if none; empty: "\n" is none
    std::unordered_map<std::string, int32_t> ranks_;   // "left right" -> merge rank
    mutable std::mutex cache_mutex_;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;   // encoded word -> ids
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerVocab vocab) {
    return std::make_unique<BpeTokenizer>(std::move(vocab));
}

}  // namespace ember
