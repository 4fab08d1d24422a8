// Greedy pair merging over a linked list of symbols, shared by byte-level BPE (merge rank) and
// SentencePiece-style BPE (token score): the best adjacent pair merges first, ties go to the
// leftmost pair, and heap entries made stale by an earlier merge are skipped.
#pragma once
#include <algorithm>
#include <cstdint>
#include <queue>
#include <string>
#include <vector>

#include "tokenizer/unicode.h"

namespace ember {

struct MergeSymbol {
    size_t start, len;   // bytes of the text; len 0 once merged into its left neighbour
    int prev, next;      // -1 at the ends
};

// One symbol per UTF-8 character (a truncated sequence at the end is one symbol too). The length
// comes from the lead byte alone, 0xF8..0xFF counting as 4, as llama.cpp's unicode_len_utf8: on
// malformed input SentencePiece then groups (and byte-falls-back) the same bytes llama.cpp does.
// Byte-level BPE only splits valid UTF-8 here.
inline std::vector<MergeSymbol> split_characters(const std::string& text) {
    static constexpr uint8_t k_len_by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    std::vector<MergeSymbol> syms;
    for (size_t i = 0; i < text.size();) {
        const size_t len = std::min<size_t>(k_len_by_high_nibble[uint8_t(text[i]) >> 4], text.size() - i);
        syms.push_back({i, len, int(syms.size()) - 1, int(syms.size()) + 1});
        i += len;
    }
    if (!syms.empty()) syms.back().next = -1;
    return syms;
}

// priority(left, right, out) -> false when the pair may not merge; otherwise out = its
// priority (higher merges first).
template <class Priority>
void merge_symbols(std::vector<MergeSymbol>& syms, Priority&& priority) {
    struct Pair {
        double priority;
        int left;
        size_t total;
    };   // total: bytes of both sides when pushed
    auto worse = [](const Pair& x, const Pair& y) {
        return x.priority != y.priority ? x.priority < y.priority : x.left > y.left;
    };
    std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> heap(worse);
    auto push = [&](int l) {
        if (l < 0 || syms[l].next < 0) return;
        const MergeSymbol& r = syms[syms[l].next];
        double p;
        if (priority(syms[l], r, p)) heap.push({p, l, syms[l].len + r.len});
    };
    for (int i = 0; i + 1 < int(syms.size()); ++i) push(i);
    while (!heap.empty()) {
        const Pair p = heap.top();
        heap.pop();
        MergeSymbol& l = syms[p.left];
        if (l.len == 0 || l.next < 0) continue;
        MergeSymbol& r = syms[l.next];
        if (l.len + r.len != p.total) continue;   // stale: a side has merged since
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) syms[r.next].prev = p.left;
        push(l.prev);
        push(p.left);
    }
}

}  // namespace ember
