// Streamed weights (llama.cpp's op offload of large batches): with partial offload, a batch of at
// least kMinTokens runs the CPU layers on the GPU, on weights uploaded for the step (block l+1's
// upload overlapping block l's compute) and on a GPU staging copy of the block's KV: the
// sequence's older KV blocks go up before the block, the blocks holding the batch's positions
// come back after it. Not to be confused with the KV in host memory (-nkvo,
// src/model/kv_in_host_memory.h: GPU layers whose KV stays in host memory) or the engine's host
// tier (src/kv/host_tier.h: the pool preempted sequences and evicted prefix blocks go to).
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/model_impl.h"

namespace ember {

class StreamedWeights {
public:
    // Batches of at least this many tokens are streamed. Above the decode-graph batch sizes
    // (<= 8), so a streamed step is never captured.
    static constexpr int32_t kMinTokens = 32;

    // Staging for the model's CPU blocks (their weights as the CPU sees them in cpu_blocks) and
    // one KV layer of `kv` geometry. Null when the GPU cannot hold it: the CPU blocks then run on
    // the CPU for every batch.
    static std::unique_ptr<StreamedWeights> open(ModelImpl& m, const std::vector<BlockWeights>& cpu_blocks,
                                                 Backend& cpu, const KVLayer& kv);
    ~StreamedWeights();

    // Pinned host memory for a CPU block's KV, so its copies run asynchronously (null: none left).
    void* alloc_host(size_t bytes) { return stream_->alloc_host(bytes); }

    // Block l of a streamed step: its weights on the GPU, its KV (cpu_kv: the CPU layer's, blocks
    // `ids` of the sequence, positions [0, n_past) already there) staged in kv().
    BlockWeights begin_block(int32_t l, const KVLayer& cpu_kv, const std::vector<int32_t>& ids, int32_t n_past);
    KVLayer& kv() { return kv_; }
    // After block l's ops: the new KV rows (positions [n_past, n_past + n_tok)) back to cpu_kv,
    // and the next block's upload started when it is streamed too.
    void end_block(int32_t l, KVLayer& cpu_kv, const std::vector<int32_t>& ids, int32_t n_past, int32_t n_tok,
                   bool next_streamed);

private:
    StreamedWeights(ModelImpl& m, std::unique_ptr<WeightStream> s) : m_(m), stream_(std::move(s)) {}
    // KV blocks [b0, b1) of the sequence between host and staging (runs of consecutive ids as one copy).
    void copy_blocks(const KVLayer& from, KVLayer& to, const std::vector<int32_t>& ids, int32_t b0, int32_t b1,
                     bool to_gpu);

    ModelImpl& m_;
    std::unique_ptr<WeightStream> stream_;
    KVLayer kv_;
    void* kv_mem_ = nullptr;
    std::vector<std::vector<int>> roles_;   // [n_layer] the role of each matrix a block's upload returns
    std::vector<Weight> staged_;            // the next block's weights, already uploading
};

}  // namespace ember
