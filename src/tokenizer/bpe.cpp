// Byte-level BPE (tokenizer.ggml.model = "gpt2"): pre-tokenize by tokenizer.ggml.pre, map each
// word's bytes to GPT-2's printable codepoints, merge adjacent symbols by merge rank.
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
        std::string encoded;
        for (const std::string& word : pre_tokenize(pre_, replace_invalid_utf8(text))) {
            encoded.clear();
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
            std::lock_guard<std::mutex> lock(cache_mutex_);
            if (cache_.size() >= k_cache_limit) cache_.clear();   // bounded memory on odd inputs
            cache_.emplace(encoded, std::move(ids));
        }
    }

    std::string normal_piece(int32_t id) const override {
        // Undo the byte -> codepoint mapping; a codepoint outside the map is kept as UTF-8.
        const std::string& t = v_.tokens[id];
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
            // Not in the vocab (an incomplete vocab): each codepoint alone, else unknown.
            for (size_t k = s.start; k < s.start + s.len;) {
                size_t len = std::min(utf8_len(uint8_t(word[k])), s.start + s.len - k);
                int32_t cid = find_token(word.substr(k, len));
                if (cid >= 0) ids.push_back(cid);
                else if (v_.unk >= 0) ids.push_back(v_.unk);
                k += len;
            }
        }
        return ids;
    }

    PreTokenizer pre_;
    bool ignore_merges_ = false;
    std::unordered_map<std::string, int32_t> ranks_;   // "left right" -> merge rank
    mutable std::mutex cache_mutex_;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;   // encoded word -> ids
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerVocab vocab) {
    return std::make_unique<BpeTokenizer>(std::move(vocab));
}

}  // namespace ember
