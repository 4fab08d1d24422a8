// BERT normalizer data (generated into bert_tables.cpp by tools/gen_bert_tables.py) and its lookups:
// the C* and Mn categories, canonical decomposition (NFD) and full lowercase mapping of a codepoint.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ember {

struct CodepointRange {
    uint32_t first, last;
};
// cp -> cpts[offset, offset + len)
struct CodepointMapping {
    uint32_t cp, offset, len;
};

extern const CodepointRange k_other_ranges[];
extern const size_t k_other_ranges_count;
extern const CodepointRange k_nonspacing_mark_ranges[];
extern const size_t k_nonspacing_mark_ranges_count;
extern const uint32_t k_nfd_cpts[];
extern const CodepointMapping k_nfd[];
extern const size_t k_nfd_count;
extern const uint32_t k_lower_cpts[];
extern const CodepointMapping k_lower[];
extern const size_t k_lower_count;

bool is_other_category(uint32_t cp);   // C*: control, format, surrogate, private use, unassigned
bool is_nonspacing_mark(uint32_t cp);  // Mn
// Appends cp's full canonical decomposition (cp itself where it has none).
void append_nfd(uint32_t cp, std::vector<uint32_t>& out);
// Appends cp's full lowercase mapping (cp itself where it has none).
void append_lower(uint32_t cp, std::vector<uint32_t>& out);

}  // namespace ember
