// Unicode helpers for the tokenizer: UTF-8 <-> codepoints, category flags for the pre-tokenizer
// regexes (\p{L} and its cased classes, \p{N}, \p{P}, \p{M}, \s), and the GPT-2 byte <->
// printable-codepoint mapping.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ember {

enum CodepointFlag : uint8_t {
    CPT_LETTER = 1,      // \p{L}
    CPT_NUMBER = 2,      // \p{N}
    CPT_WHITESPACE = 4,  // \s (Unicode White_Space)
    CPT_PUNCT = 8,       // \p{P}
    CPT_MARK = 16,       // \p{M}
    CPT_UPPER = 32,      // \p{Lu}, \p{Lt} (tekken's split tells cased letters apart)
    CPT_LOWER = 64,      // \p{Ll}
};

struct CodepointRun {
    uint32_t first;
    uint8_t flags;
};
extern const CodepointRun k_codepoint_runs[];   // generated: src/tokenizer/unicode_tables.cpp
extern const size_t k_codepoint_runs_count;

uint8_t codepoint_flags(uint32_t cp);
constexpr uint32_t k_invalid_cpt = 0x110000;   // codepoints >= this stand for malformed bytes

// Length of the UTF-8 sequence a lead byte starts (1 for continuation/invalid bytes, so that
// malformed input still advances one byte at a time).
inline size_t utf8_len(uint8_t lead) {
    if (lead < 0xC0) return 1;
    if (lead < 0xE0) return 2;
    if (lead < 0xF0) return 3;
    if (lead < 0xF8) return 4;
    return 1;
}

// Decodes UTF-8 leniently: a malformed byte becomes the pseudo-codepoint 0x110000 + byte (no
// category, see k_invalid_cpt), so splitting never fails and byte offsets stay exact.
// offsets[i] is the byte offset of codepoint i; offsets has one extra entry = text.size().
void utf8_decode(const std::string& text, std::vector<uint32_t>& cpts, std::vector<size_t>& offsets);
void utf8_append(std::string& out, uint32_t cp);
// text with each malformed byte (as utf8_decode finds them) replaced by U+FFFD, as llama.cpp's
// unicode_cpts_from_utf8 does before byte-level BPE splits the text.
std::string replace_invalid_utf8(const std::string& text);

// GPT-2 byte-level mapping: each byte maps to a printable codepoint (as UTF-8 text).
const std::string& byte_to_unicode(uint8_t b);
// Inverse mapping; returns -1 for codepoints that are not the image of a byte.
int unicode_to_byte(uint32_t cp);

}  // namespace ember
