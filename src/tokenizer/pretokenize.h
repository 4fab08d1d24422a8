// Pre-tokenizers of byte-level BPE vocabularies: the regex chains that llama.cpp selects by
// tokenizer.ggml.pre, implemented by hand over codepoint category flags (no std::regex).
#pragma once
#include <string>
#include <vector>

namespace ember {

enum class PreTokenizer {
    GPT2,     // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    SMOLLM,   // \p{N} isolated first, then GPT2 (also starcoder, refact, command-r, ...)
    LLAMA3,   // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    QWEN2,    // as LLAMA3 but \p{N} one digit at a time
    // [^\r\n\p{L}\p{N}]?U*L+|[^\r\n\p{L}\p{N}]?U+L*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
    // with U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], L = [\p{Ll}\p{Lm}\p{Lo}\p{M}] (Mistral's tekken)
    TEKKEN,
    // as TEKKEN with (?i:'s|'t|'re|'ve|'m|'ll|'d)? after each letter run and \p{N}{1,3} (gpt-4o,
    // llama4: Phi-4-mini, Llama 4)
    GPT4O,
    DEFAULT,  // [\p{P}$+<=>^~|]+ , GPT2 , \p{N}+ , [0-9][0-9][0-9] applied in turn
    // [^\n]+|[\n]+ over text whose spaces are U+2581 already: Gemma 4's SentencePiece-style BPE, whose
    // merges run over whole lines (llama.cpp's "gemma4")
    GEMMA4,
};

// The pre-tokenizer llama.cpp names `name` (tokenizer.ggml.pre); a name ember does not know
// fails naming it, since splitting text another way would silently change the tokens.
PreTokenizer pre_tokenizer_from_name(const std::string& name);

// Splits text into words (byte substrings of text, in order, concatenating back to text).
std::vector<std::string> pre_tokenize(PreTokenizer kind, const std::string& text);

}  // namespace ember
