// Importance-matrix collection (ember-imatrix): a Backend wrapper that records, for every matmul
// of a block weight, each input column's sum of squared activations and the tokens summed, keyed
// by the weight's tensor name; every op still runs on the wrapped backend.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ember {

struct ImatrixEntry {
    std::vector<double> sums;   // [n_in]
    int64_t count = 0;          // tokens
};

class ImatrixCollector {
public:
    // process_output: also the output head (llama-imatrix's --process-output); else only blk.* weights.
    explicit ImatrixCollector(bool process_output) : process_output_(process_output) {}
    void add(const Weight& w, const float* x, int32_t n_tok);
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
// the primitives, so every projection reaches matmul.
std::unique_ptr<Backend> record_imatrix(std::unique_ptr<Backend> inner, std::shared_ptr<ImatrixCollector> c);

}  // namespace ember
