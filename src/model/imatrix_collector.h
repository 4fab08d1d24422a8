// Importance-matrix collection (ember-imatrix): a Backend wrapper that records, for every matmul
// of a block weight, each input column's sum of squared activations and the tokens summed, keyed
// by the weight's tensor name (a stacked expert tensor: one row of sums and one token count per expert,
// as llama-imatrix keeps them); every op still runs on the wrapped backend.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ember {

struct ImatrixEntry {
    std::vector<double> sums;      // [n_mat][n_in]: n_mat the experts of a stacked tensor, else 1
    std::vector<int64_t> counts;   // [n_mat]: the tokens each matrix saw
};

class ImatrixCollector {
public:
    // process_output: also the output head (llama-imatrix's --process-output); else only blk.* weights.
    explicit ImatrixCollector(bool process_output) : process_output_(process_output) {}
    // x [n_tok][w.n_in], the input of matrix `expert` of n_mat (a stacked tensor's expert; 0 of 1 else).
    void add(const Weight& w, const float* x, int32_t n_tok, int32_t expert = 0, int32_t n_mat = 1);
    std::map<std::string, ImatrixEntry> entries() const;

private:
    bool process_output_;
    mutable std::mutex mutex_;
    std::map<std::string, ImatrixEntry> entries_;
};

// The collector that contexts made from now on record into (null: none). One collection at a time
// in a process: ember-imatrix sets it around its own context.
void set_imatrix_collector(std::shared_ptr<ImatrixCollector> c);
std::shared_ptr<ImatrixCollector> imatrix_collector();

// inner, with its matmuls recorded into c. The fused ops take Backend's defaults, which compose
// the primitives, so every projection reaches matmul (a mixture's experts through Backend's default moe,
// each expert's matrix told apart by its place in the stacked weight prepared here).
std::unique_ptr<Backend> record_imatrix(std::unique_ptr<Backend> inner, std::shared_ptr<ImatrixCollector> c);

}  // namespace ember
