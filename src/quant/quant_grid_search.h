// The grid search the IQ2 / IQ3 quantizers share (as ggml's): a grid of points of D levels, and for every point
// of levels up to the search's largest, its grid index or, off the grid, its nearest grid points.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace ember {

// Round to nearest, ties to even (ggml's nearest_int), for |v| < 2^22.
inline int nearest_even(float v) {
    const float shifted = v + 12582912.0f;
    int32_t bits;
    std::memcpy(&bits, &shifted, 4);
    return (bits & 0x007FFFFF) - 0x00400000;
}

// D levels l of BITS bits each (the search's magnitudes 2 l + 1). The decoders' grids hold D byte values a point
// (D / 4 words, the low word first); level(v) turns a value back into its level. A point off the grid has as
// neighbours the grid points at its n_dist smallest squared distances, by distance then index.
template <int D, int BITS>
class GridSearch {
public:
    GridSearch(const uint32_t* words, int size, int n_dist, int (*level)(int), int max_level)
        : max_level_(max_level), points_(size), index_(1 << (BITS * D), -1), neighbours_(1 << (BITS * D)) {
        for (int j = 0; j < size; ++j) {
            int u = 0;
            for (int i = 0; i < D; ++i) {
                const int l = level(int((words[D / 4 * j + i / 4] >> (8 * (i % 4))) & 0xFF));
                points_[j][i] = int8_t(2 * l + 1);
                u |= l << (BITS * i);
            }
            index_[u] = j;
        }
        std::vector<std::pair<int, int>> dist(size);
        for (int u = 0; u < int(index_.size()); ++u) {
            if (index_[u] >= 0 || !searched(u)) continue;
            for (int j = 0; j < size; ++j) {
                int d2 = 0;
                for (int i = 0; i < D; ++i) {
                    const int diff = points_[j][i] - (2 * ((u >> (BITS * i)) & ((1 << BITS) - 1)) + 1);
                    d2 += diff * diff;
                }
                dist[j] = {d2, j};
            }
            std::sort(dist.begin(), dist.end());
            for (int j = 0, d2 = dist[0].first, have = 1; j < size; ++j) {
                if (dist[j].first > d2) {
                    if (have == n_dist) break;
                    d2 = dist[j].first;
                    ++have;
                }
                neighbours_[u].push_back(uint16_t(dist[j].second));
            }
        }
    }

    int key(const int8_t* L) const {
        int u = 0;
        for (int i = 0; i < D; ++i) u |= L[i] << (BITS * i);
        return u;
    }
    // The grid index of the levels L, -1 off the grid.
    int index(const int8_t* L) const { return index_[key(L)]; }
    // Off the grid: its nearest grid points (by distance, then index), for searches scoring levels their own way.
    const std::vector<uint16_t>& neighbours(const int8_t* L) const { return neighbours_[key(L)]; }
    // Grid point j's magnitudes 2 l + 1.
    const int8_t* point(int j) const { return points_[j].data(); }

    // Off the grid: the neighbour of least w-weighted squared error against x at this scale; L set to it.
    int best_neighbour(int8_t* L, const float* x, const float* w, float scale) const {
        float best = 3.4028235e38f;
        int at = -1;
        for (const uint16_t j : neighbours_[key(L)]) {
            float d2 = 0;
            for (int i = 0; i < D; ++i) {
                const float diff = scale * float(points_[j][i]) - x[i];
                d2 += w[i] * diff * diff;
            }
            if (d2 < best) {
                best = d2;
                at = j;
            }
        }
        for (int i = 0; i < D; ++i) L[i] = int8_t((points_[at][i] - 1) / 2);
        return at;
    }

    // The levels of x * id rounded, clamped to [0, max_level], then on the grid or moved to its best neighbour
    // at scale. Returns whether they were on the grid.
    bool place(int8_t* L, const float* x, const float* w, float id, float scale) const {
        for (int i = 0; i < D; ++i) L[i] = int8_t(std::clamp(nearest_even(0.5f * (id * x[i] - 1)), 0, max_level_));
        if (index(L) >= 0) return true;
        best_neighbour(L, x, w, scale);
        return false;
    }

private:
    bool searched(int u) const {
        for (int i = 0; i < D; ++i)
            if (((u >> (BITS * i)) & ((1 << BITS) - 1)) > max_level_) return false;
        return true;
    }

    int max_level_;
    std::vector<std::array<int8_t, D>> points_;
    std::vector<int> index_;
    std::vector<std::vector<uint16_t>> neighbours_;
};

}  // namespace ember
