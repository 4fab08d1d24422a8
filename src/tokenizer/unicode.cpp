// Unicode helpers for the tokenizer: codepoint flag lookup, lenient UTF-8 decoding, and the
// GPT-2 byte <-> unicode table (printable bytes map to themselves, the rest to U+0100 upward).
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace ember {

namespace {

std::array<uint8_t, 128> make_ascii_flags() {
    std::array<uint8_t, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) {
        auto it = std::upper_bound(k_codepoint_runs, k_codepoint_runs + k_codepoint_runs_count, c,
                                   [](uint32_t v, const CodepointRun& r) { return v < r.first; });
        t[c] = (it - 1)->flags;
    }
    return t;
}

struct ByteTables {
    std::array<std::string, 256> to_unicode;
    std::array<int16_t, 512> from_unicode;  // every image codepoint is < 0x144
    ByteTables() {
        from_unicode.fill(-1);
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
            utf8_append(to_unicode[b], cp);
            from_unicode[cp] = int16_t(b);
        }
    }
};

const ByteTables& byte_tables() {
    static const ByteTables t;
    return t;
}

}  // namespace

uint8_t codepoint_flags(uint32_t cp) {
    static const std::array<uint8_t, 128> ascii = make_ascii_flags();
    if (cp < 128) return ascii[cp];
    if (cp >= k_invalid_cpt) return 0;  // a malformed byte (see utf8_decode): no category
    auto it = std::upper_bound(k_codepoint_runs, k_codepoint_runs + k_codepoint_runs_count, cp,
                               [](uint32_t v, const CodepointRun& r) { return v < r.first; });
    return (it - 1)->flags;
}

void utf8_decode(const std::string& text, std::vector<uint32_t>& cpts, std::vector<size_t>& offsets) {
    cpts.clear();
    offsets.clear();
    const auto* s = reinterpret_cast<const uint8_t*>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        offsets.push_back(i);
        uint8_t c = s[i];
        size_t len = utf8_len(c);
        bool ok = len > 1 && i + len <= n;
        uint32_t cp = 0;
        if (ok) {
            cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
            for (size_t k = 1; k < len; ++k) {
                if ((s[i + k] & 0xC0) != 0x80) {
                    ok = false;
                    break;
                }
                cp = (cp << 6) | (s[i + k] & 0x3F);
            }
        }
        if (len == 1 && c < 0x80) {
            cp = c;
        } else if (!ok) {
            cp = k_invalid_cpt + c;
            len = 1;
        }
        cpts.push_back(cp);
        i += len;
    }
    offsets.push_back(n);
}

void utf8_append(std::string& out, uint32_t cp) {
    if (cp >= k_invalid_cpt) {  // a malformed byte kept as itself
        out.push_back(char(cp - k_invalid_cpt));
    } else if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

std::string replace_invalid_utf8(const std::string& text) {
    std::vector<uint32_t> cpts;
    std::vector<size_t> offsets;
    utf8_decode(text, cpts, offsets);
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < cpts.size(); ++i) {
        if (cpts[i] >= k_invalid_cpt) out += "\xEF\xBF\xBD";
        else out.append(text, offsets[i], offsets[i + 1] - offsets[i]);
    }
    return out;
}

const std::string& byte_to_unicode(uint8_t b) { return byte_tables().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) { return cp < 512 ? byte_tables().from_unicode[cp] : -1; }

}  // namespace ember
