// Tokenizer built from GGUF metadata: byte-level BPE (GPT-2 style, pre-tokenizer chosen by
// tokenizer.ggml.pre), SentencePiece-style (tokenizer.ggml.model = "llama", byte fallback),
// WordPiece (tokenizer.ggml.model = "bert") and SentencePiece Unigram ("t5").
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ember {

class GGUFFile;

class Tokenizer {
public:
    virtual ~Tokenizer() = default;
    // Throws InvalidInput naming the missing/invalid tokenizer.* key.
    static std::unique_ptr<Tokenizer> from_gguf(const GGUFFile& file);

    // add_bos is honoured only where the model asks for BOS (tokenizer.ggml.add_bos_token),
    // as in llama.cpp. parse_special: text like "<|im_start|>" becomes its control token.
    virtual std::vector<int32_t> encode(const std::string& text, bool add_bos, bool parse_special) const = 0;
    // The text as it is: no BOS, no special tokens, no SentencePiece space put before it.
    virtual std::vector<int32_t> encode_plain(const std::string& text) const = 0;
    // The bytes a token stands for (byte-level BPE unmapped, SentencePiece "▁" -> " ",
    // byte tokens <0xNN> -> that byte). Control tokens give their text only when special.
    virtual std::string token_to_piece(int32_t id, bool special) const = 0;
    std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

    virtual int32_t n_vocab() const = 0;
    virtual int32_t bos() const = 0;          // -1 if none
    virtual int32_t eos() const = 0;          // -1 if none
    virtual int32_t sep() const = 0;          // -1 if none: [SEP] of BERT vocabularies
    virtual bool add_sep() const = 0;         // sep between a pair's texts (and, for WordPiece, last)
    virtual const std::string& model() const = 0;   // tokenizer.ggml.model: "gpt2", "llama", "bert", "t5"
    virtual bool add_bos() const = 0;
    virtual bool add_eos() const = 0;         // an encoding with specials ends with eos
    virtual bool is_eog(int32_t id) const = 0; // end of generation (eos, eot, <|im_end|>...)
    virtual const std::string& token_text(int32_t id) const = 0;  // raw vocab entry
    // Control, unknown and unused tokens, and user-defined ones spelled "<...>": never plain text
    // (constrained decoding keeps a grammar's text from matching them).
    virtual bool is_special(int32_t id) const = 0;
};

// Turns a stream of token ids into text without ever splitting a UTF-8 character: bytes of an
// incomplete character are held back until the character is complete.
class IncrementalDetokenizer {
public:
    explicit IncrementalDetokenizer(const Tokenizer& tok, bool special = false) : tok_(tok), special_(special) {}
    std::string push(int32_t id);   // complete UTF-8 text now available (may be empty)
    std::string flush();            // whatever is held back (invalid/incomplete bytes)

private:
    const Tokenizer& tok_;
    bool special_;
    std::string pending_;
};

}  // namespace ember
