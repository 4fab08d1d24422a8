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
    DEFAULT,  // [\p{P}$+<=>^~|]+ , GPT2 , \p{N}+ , [0-9][0-9][0-9] applied in turn
};

// Unknown names map to DEFAULT (llama.cpp's fallback chain) rather than failing: a model with
// a new pre-tokenizer name still tokenizes, possibly with slightly different word boundaries.
PreTokenizer pre_tokenizer_from_name(const std::string& name);

// Splits text into words (byte substrings of text, in order, concatenating back to text).
std::vector<std::string> pre_tokenize(PreTokenizer kind, const std::string& text);

}  // namespace ember
