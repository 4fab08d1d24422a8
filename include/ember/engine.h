// The continuous-batching engine: many requests share one model, one paged KV pool (with a
// prefix cache) and every forward step. A loop thread of its own admits requests, builds each
// step under a token budget (decodes first, then chunked prefill), samples every sequence in
// C++, preempts the newest sequence when KV blocks run out (swapped out to a host tier and back,
// or recomputed later), and hands tokens out through a thread-safe queue.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/model.h"
#include "ember/sampling.h"

namespace ember {

struct EngineParams {
    int32_t n_ctx = 4096;                   // most tokens (prompt + generated) of one sequence
    int32_t max_num_seqs = 64;              // sequences with KV at once
    int32_t max_num_batched_tokens = kDefaultBatchTokens;   // tokens of one forward step
    int32_t n_threads = 0;                  // 0: all hardware threads
    int32_t kv_block_size = kDefaultKvBlockSize;
    // The KV pool: kv_blocks blocks if > 0, else as many as kv_mb MiB hold if > 0, else room for
    // max_num_seqs full sequences, at most kDefaultKvMiB (but always one full sequence).
    int32_t kv_blocks = 0;
    double kv_mb = 0.0;
    // The host tier, in MiB of host memory (pinned on CUDA); 0: none. A preempted sequence's
    // blocks are swapped out to it instead of being recomputed, and blocks the prefix cache
    // evicts are kept there and found again.
    double kv_host_mb = 0.0;
    GGMLType type_k = GGMLType::F16, type_v = GGMLType::F16;
    bool enable_prefix_caching = true;
    // Hybrid models (recurrent layers): the recurrent state is kept every state_snapshot_interval
    // tokens of a sequence (a multiple of kv_block_size; 0: never), within state_snapshot_mb MiB of
    // host memory, so a cached prefix resumes from the last kept state in it.
    int32_t state_snapshot_interval = 128;
    int32_t state_snapshot_mb = 1024;
    // Same tokens for a request whether it runs alone or in any batch (batch-invariant kernels).
    bool deterministic = false;
    bool offload_kqv = true;
    int32_t kv_gpu_cache_mb = kDefaultKvGpuCacheMiB;   // as ContextParams'
    static constexpr double kDefaultKvMiB = 4096.0;
};

struct RequestParams {
    std::vector<int32_t> prompt;
    SamplingParams sampling;
    int32_t max_tokens = 16;
    int32_t min_tokens = 0;                 // end-of-generation and stop ids banned until then
    std::vector<int32_t> stop_token_ids;    // finish with "stop" (the token is not output)
    bool ignore_eos = false;
    int32_t logprobs = -1;                  // -1: none; 0: the sampled token's; k > 0: and the top k
    bool prompt_logprobs = false;           // logprob of every prompt token after the first
    int32_t prompt_top_logprobs = 0;        // with prompt_logprobs: and the top k of each position
    // Constrained decoding (llguidance loaded: load_llguidance): "" for none, else grammar's kind,
    // as GrammarCompiler::compile takes it. Only tokens the grammar allows are drawn, whatever the
    // sampling parameters; end of generation only where the grammar is complete.
    std::string grammar_kind;
    std::string grammar;
    static constexpr int32_t kMaxLogprobs = 20;   // vLLM's default max_logprobs
};

// New tokens of one request since its previous output.
struct EngineOutput {
    int64_t request_id = 0;
    std::vector<int32_t> token_ids;
    std::vector<float> logprobs;                                     // per token, when asked
    std::vector<int32_t> ranks;   // per token, when asked: 1 + the tokens more likely than it
    std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;   // per token, when k > 0
    std::vector<float> prompt_logprobs;   // once, with the first output, when asked
    std::vector<int32_t> prompt_ranks;    // and their ranks
    std::vector<std::vector<std::pair<int32_t, float>>> prompt_top_logprobs;   // per position, when k > 0
    int32_t num_cached_tokens = 0;        // prompt tokens the prefix cache served
    bool finished = false;
    std::string finish_reason;            // "stop", "length", "abort" or "error" once finished
    int32_t stop_token_id = -1;           // the request's stop_token_ids entry that ended it, else -1
    std::string error;
};

struct EngineStats {
    int32_t running = 0, waiting = 0;
    int32_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0;
    int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;   // full blocks looked up / found
    int64_t cached_prompt_tokens = 0;
    int64_t preemptions = 0;                            // swapped out or freed for recompute
    int32_t swapped = 0;                                // of `waiting`: swapped out to the host tier
    int64_t swaps_out = 0, swaps_in = 0;                // sequences
    int32_t host_blocks_total = 0, host_blocks_used = 0, host_blocks_cached = 0;
    int64_t host_cache_hits = 0;                        // prefix blocks copied back from the host tier
    // Hybrid models: recurrent state slots (one per sequence that may run) and those no sequence holds.
    int32_t state_slots_total = 0, state_slots_free = 0;
    int64_t prompt_tokens = 0, generation_tokens = 0;   // computed by forward steps / sampled
    int64_t steps = 0;
    // Seconds the loop thread spent, over all steps, planning them (and copying swaps), in the
    // forward (device time included), sampling, and handing out outputs (the lock's wait included).
    double seconds_schedule = 0, seconds_forward = 0, seconds_sample = 0, seconds_output = 0;
    // Of seconds_sample: waiting for constrained sequences' token masks the grammar worker had not
    // finished during the forward.
    double seconds_grammar_wait = 0;
};

struct EngineImpl;

class Engine {
public:
    // Throws InvalidInput naming a bad parameter, OutOfMemory when the KV pool does not fit.
    Engine(std::shared_ptr<Model> model, const EngineParams& params);
    ~Engine();   // close()
    // Queues a request; returns its id. Throws InvalidInput naming what is wrong (empty prompt,
    // a token id out of range, prompt + max_tokens over n_ctx, a bad sampling parameter, an invalid
    // grammar). A grammar is compiled here (cached per grammar: a repeated one costs nothing).
    int64_t add_request(const RequestParams& request);
    // Finishes the request with "abort" within one step, its KV freed; unknown ids are ignored.
    void cancel(int64_t request_id);
    // Waits up to timeout_s for outputs; returns every pending one (one per request).
    std::vector<EngineOutput> poll(double timeout_s);
    EngineStats stats() const;
    // Stops the loop thread; requests still queued or running finish with "abort".
    void close();
    const EngineParams& params() const;
    const Model& model() const;

private:
    std::unique_ptr<EngineImpl> impl_;
};

}  // namespace ember
