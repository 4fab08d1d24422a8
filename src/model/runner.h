// The forward pass of one step over tokens that may belong to several sequences: the model's
// weights on the devices the placement plan gives, every layer's paged KV storage, the activation
// scratch, and the logits (or, for embeddings, the final-normed hidden states) of the rows the caller
// asks for. Context (one sequence) and the engine (many) both drive it; which KV blocks a sequence
// owns is the caller's business (src/kv).
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "ember/model.h"

namespace ember {

// Filled by Context and Engine from their ContextParams / EngineParams, whose defaults are the
// ones that count (include/ember/model.h); these only make a default-constructed one usable.
struct RunnerParams {
    int32_t n_batch = kDefaultBatchTokens;   // most tokens of one step
    int32_t n_threads = 0;         // 0: all hardware threads
    int32_t n_kv_blocks = 0;       // KV blocks of every layer (the pool the block ids index)
    // Most tokens one sequence holds (n_ctx): LongRoPE models rotate with their long factors when
    // it passes the original context, as llama.cpp does; 0: unknown (the short factors).
    int32_t n_ctx_seq = 0;
    int32_t n_host_tier_slots = 0; // host-memory slots of a block's size: the engine's host tier
    int32_t kv_block_size = kDefaultKvBlockSize;
    GGMLType type_k = GGMLType::F16, type_v = GGMLType::F16;
    bool offload_kqv = true;
    // offload_kqv=False (KV in host memory, kv_in_host_memory.h): MiB of GPU memory that keep
    // copies of its blocks.
    int32_t kv_gpu_cache_mb = 0;
    // The head stops at the final norm: each row asked for is the hidden state after output_norm
    // ([n_embd] floats, what llama.cpp pools into embeddings) instead of logits.
    bool embeddings = false;
    // Sequences whose recurrent state (hybrid models' recurrent layers) the runner keeps at once,
    // the slots BatchInfo::state_slot names; unused by models without recurrent layers.
    int32_t n_state_slots = 0;
};

// Rows [first, first + count) of a step whose logits (or hidden rows) are computed.
struct RowRange {
    int32_t first = 0, count = 0;
};

struct RunnerImpl;

class Runner {
public:
    // Throws InvalidInput for parameters the model cannot run with, OutOfMemory when the KV or
    // the scratch does not fit.
    Runner(std::shared_ptr<Model> model, const RunnerParams& params);
    ~Runner();
    // One step: tokens[0..batch.n_tok) at batch's positions and block tables (n_tok <= n_batch).
    // The logits of `rows`, in their order, are appended to logits() (clear_logits() empties it);
    // with greedy, each row's greedy_token (backend/greedy_token.h) goes to greedy_ids() instead, and the
    // logits stay where the head ran.
    void forward(const int32_t* tokens, const BatchInfo& batch, const std::vector<RowRange>& rows, bool greedy = false);
    // The rows' greedy ids of the last forward with greedy (-1: every logit -inf or NaN).
    const std::vector<int32_t>& greedy_ids() const;
    // [n_logits][row_width()], host memory: logits, or the normed hidden rows with params.embeddings.
    const float* logits() const;
    int32_t row_width() const;   // n_vocab, or n_embd with params.embeddings
    int32_t n_logits() const;
    void clear_logits();
    // Copies every layer's K and V of each (KV block, host slot) pair into the host slot, and of
    // each (host slot, KV block) pair back. Runs of consecutive ids on both sides go as one copy.
    void copy_blocks_to_host(const std::vector<std::pair<int32_t, int32_t>>& dev_to_host);
    void copy_blocks_from_host(const std::vector<std::pair<int32_t, int32_t>>& host_to_dev);
    // Runs work on the CPU backend's threads (idle between steps): the engine's batch sampling.
    HostParallelFor parallel_for() const;
    // Zeroes recurrent state slot `slot` (a sequence starting from no tokens); nothing for a model
    // without recurrent layers.
    void clear_state(int32_t slot);
    // Recurrent state slot `slot` copied to host memory and written back (RecurrentState::save).
    std::vector<float> save_state(int32_t slot) const;
    void restore_state(int32_t slot, const std::vector<float>& saved);
    // Floats of one recurrent state slot over all layers (0 without recurrent layers).
    int64_t state_slot_floats() const;
    // Bytes one KV block takes over all layers (K and V).
    size_t kv_block_bytes_all_layers() const;
    const Model& model() const;
    std::shared_ptr<Model> model_ptr() const;
    const RunnerParams& params() const;

private:
    std::unique_ptr<RunnerImpl> impl_;
};

// Bytes one KV block of `block_size` tokens takes over all of the model's attention layers (K and V).
size_t kv_block_bytes_model(const HParams& hp, int32_t block_size, GGMLType type_k, GGMLType type_v);

}  // namespace ember
