// The tokenizer's inputs as plain vectors (what GGUF tokenizer.* keys hold), the shared base of
// both tokenizer kinds (vocab lookup, special-token partitioning, pieces), and the factory.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ember/tokenizer.h"

namespace ember {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
// clang-format off: a table of llama.cpp's values, kept packed
enum class TokenType : int32_t {
    UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6,
};
// clang-format on

struct TokenizerVocab {
    std::string model;                  // tokenizer.ggml.model: "gpt2", "llama", "bert", "t5" or "gemma4"
    std::string pre = "default";        // tokenizer.ggml.pre (BPE only; "gemma4" for model "gemma4")
    std::vector<std::string> tokens;    // tokenizer.ggml.tokens
    std::vector<float> scores;          // tokenizer.ggml.scores (empty: all 0)
    std::vector<int32_t> types;         // tokenizer.ggml.token_type (empty: all NORMAL)
    std::vector<std::string> merges;    // tokenizer.ggml.merges, "left right", rank = index
    int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;   // -1: none
    int32_t sep = -1;                   // tokenizer.ggml.seperator_token_id (sic, llama.cpp's spelling)
    bool add_bos = false;
    bool add_eos = false;
    bool add_sep = false;               // SEP ends an encoding with specials ([CLS] text [SEP])
    bool add_space_prefix = true;       // SentencePiece only
    bool lowercase = true;              // WordPiece only: tokenizer.ggml.normalizer.lowercase
    bool strip_accents = true;          // WordPiece only: tokenizer.ggml.normalizer.strip_accents
    std::string charsmap;               // Unigram only: tokenizer.ggml.precompiled_charsmap's bytes
    bool remove_extra_whitespaces = false;   // Unigram only: spaces merged, one U+2581 before each word
};

// Validates the vocab (sizes, ids in range, model name) and builds the tokenizer.
// Throws InvalidInput naming the offending field.
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerVocab vocab);
// "<0xNN>" -> NN, anything else -> -1.
int byte_token_value(const std::string& text);
// SentencePiece's mark for a space (U+2581 LOWER ONE EIGHTH BLOCK) in pieces.
constexpr char k_space_mark[] = "\xE2\x96\x81";
// A piece's text with each space mark turned back into a space.
std::string spaces_from_marks(const std::string& piece);

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerVocab vocab);   // bpe.cpp
std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerVocab vocab);   // spm.cpp
std::unique_ptr<Tokenizer> make_wordpiece_tokenizer(TokenizerVocab vocab);   // wordpiece.cpp
std::unique_ptr<Tokenizer> make_unigram_tokenizer(TokenizerVocab vocab);     // unigram.cpp

// What both kinds share. Subclasses tokenize one run of plain text (no special tokens in it)
// and turn NORMAL tokens into bytes.
class VocabTokenizer : public Tokenizer {
public:
    explicit VocabTokenizer(TokenizerVocab vocab);

    std::vector<int32_t> encode(const std::string& text, bool add_bos, bool parse_special) const override;
    std::string token_to_piece(int32_t id, bool special) const override;

    int32_t n_vocab() const override { return int32_t(v_.tokens.size()); }
    int32_t bos() const override { return v_.bos; }
    int32_t eos() const override { return v_.eos; }
    int32_t sep() const override { return v_.sep; }
    bool add_sep() const override { return v_.add_sep; }
    const std::string& model() const override { return v_.model; }
    bool add_bos() const override { return v_.add_bos; }
    bool add_eos() const override { return v_.add_eos; }
    bool is_eog(int32_t id) const override;
    const std::string& token_text(int32_t id) const override;
    bool is_special(int32_t id) const override;
    std::vector<int32_t> encode_plain(const std::string& text) const override;

    // SentencePiece decoding drops the space its encoder put before the text.
    virtual bool decode_strips_leading_space() const { return false; }

protected:
    // Appends the tokens of text (a fragment between special tokens). after_special: the
    // fragment starts the text or follows a special token (SentencePiece adds its space there).
    virtual void encode_fragment(const std::string& text, bool after_special, std::vector<int32_t>& out) const = 0;
    virtual std::string normal_piece(int32_t id) const = 0;

    TokenType type(int32_t id) const { return v_.types.empty() ? TokenType::NORMAL : TokenType(v_.types[id]); }
    int32_t find_token(const std::string& text) const {
        auto it = token_ids_.find(text);
        return it == token_ids_.end() ? -1 : it->second;
    }

    TokenizerVocab v_;

private:
    // A special token found in the text: special_[rank] at byte pos.
    struct SpecialMatch {
        uint32_t rank, pos;
    };
    // Every place a special token of the trie starts (user-defined ones only unless parse_special).
    std::vector<SpecialMatch> special_candidates(const std::string& text, bool parse_special) const;

    std::unordered_map<std::string, int32_t> token_ids_;
    std::vector<int32_t> special_;       // CONTROL/USER_DEFINED/UNKNOWN ids, longest text first
    // The special tokens' texts as a byte trie: node 0 is the root, child (node << 8 | byte);
    // a node's token is the first rank in special_ spelled so (any type, and user-defined only).
    std::unordered_map<uint64_t, int32_t> trie_child_;
    std::vector<int32_t> trie_rank_any_, trie_rank_user_;
    std::vector<bool> eog_;
};

}  // namespace ember
