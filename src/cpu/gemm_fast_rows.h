// The loop over row groups that the fast kernels of every ISA share (gemm_fast_avx2.cpp,
// gemm_fast_avx512.cpp): groups of kRows rows (one per vector lane), each run against every token
// tile, with the next group prefetched and a last partial group padded. Each kernel file
// instantiates it with its own kernel in its own anonymous namespace, so every instantiation is
// compiled for that file's ISA only.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/gemm_fast.h"

namespace ember {

// run(std::integral_constant<int, T>, row0, n_rows, a, yt, next) computes yt[t * n_out + r] for the
// group's rows r < n_rows (row r at row0 + r * w_row, a whole group of kRows readable) and the
// T <= kFastTok tokens of the activation tile a; next: the following group, to prefetch (or null).
template <int kRows, class Run>
void fast_gemm_rows(int64_t n_in, const uint8_t* w, size_t w_row, const uint8_t* act, int32_t n_tok, int64_t o_begin,
                    int64_t o_end, float* y, int64_t n_out, Run&& run) {
    const int64_t n_act = n_in / 32;   // activation blocks per token
    const auto* acts = reinterpret_cast<const FastActBlock*>(act);
    thread_local std::vector<uint8_t> tail;
    for (int64_t o = o_begin; o < o_end; o += kRows) {
        const int n_rows = int(std::min<int64_t>(kRows, o_end - o));
        const uint8_t* row0 = w + o * w_row;
        if (n_rows < kRows) {
            // A last partial group reads a copy padded with zero rows (scale 0), whose lanes are
            // not stored.
            tail.assign(kRows * w_row, 0);
            std::memcpy(tail.data(), row0, n_rows * w_row);
            row0 = tail.data();
        }
        // The next group's rows (one contiguous run of bytes) are prefetched a slice per block
        // while the first token tile runs: the interleaved row streams defeat the hardware
        // prefetchers (a weight from DRAM ran at half vec_dot's speed without this).
        const uint8_t* next = o + 2 * kRows <= o_end ? w + (o + kRows) * w_row : nullptr;
        for (int32_t t = 0; t < n_tok; t += kFastTok) {
            const FastActBlock* a = acts + (t / kFastTok) * n_act;
            float* yt = y + int64_t(t) * n_out + o;
            const uint8_t* pf = t == 0 ? next : nullptr;
            using std::integral_constant;
            switch (std::min(kFastTok, n_tok - t)) {
                case 1: run(integral_constant<int, 1>(), row0, n_rows, a, yt, pf); break;
                case 2: run(integral_constant<int, 2>(), row0, n_rows, a, yt, pf); break;
                case 3: run(integral_constant<int, 3>(), row0, n_rows, a, yt, pf); break;
                case 4: run(integral_constant<int, 4>(), row0, n_rows, a, yt, pf); break;
                case 5: run(integral_constant<int, 5>(), row0, n_rows, a, yt, pf); break;
                case 6: run(integral_constant<int, 6>(), row0, n_rows, a, yt, pf); break;
                case 7: run(integral_constant<int, 7>(), row0, n_rows, a, yt, pf); break;
                default: run(integral_constant<int, 8>(), row0, n_rows, a, yt, pf); break;
            }
        }
    }
}

}  // namespace ember
