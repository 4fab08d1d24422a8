// One request inside the engine: its tokens (prompt, then generated), how many of them have KV
// in the cache, its sampler, and the output being gathered for the next hand-out.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/grammar_worker.h"
#include "ember/engine.h"
#include "ember/sampling.h"

namespace ember {

struct Sequence {
    int64_t id = 0;
    uint64_t order = 0;              // arrival order: the newest running sequence is preempted first
    RequestParams req;
    std::vector<int32_t> tokens;     // prompt + generated; the last generated one has no KV yet
    int32_t n_prompt = 0;
    int32_t n_computed = 0;          // tokens whose KV is in the cache
    int32_t n_generated = 0;
    bool admitted = false;           // admitted once (num_cached_tokens counts the first admission)
    int32_t state_slot = -1;         // its recurrent state slot while it runs (hybrid models), else -1
    // Admitted on a kept prefix's state: written into its slot before its next step, then dropped.
    std::shared_ptr<const std::vector<float>> resume_state;
    std::unique_ptr<Sampler> sampler;
    std::shared_ptr<GrammarSlot> grammar;   // constrained decoding's state; null when unconstrained
    std::vector<float> prompt_lp;    // prompt_lp[p]: logprob of tokens[p + 1], gathered as computed
    std::vector<int32_t> prompt_rank;   // and its rank
    std::vector<std::vector<std::pair<int32_t, float>>> prompt_top;   // and the top k, when asked
    bool prompt_lp_sent = false;
    EngineOutput out;                // gathered since the last hand-out

    int32_t need() const { return (int32_t)tokens.size() - n_computed; }
    bool wants_prompt_logprobs() const { return req.prompt_logprobs && !prompt_lp_sent; }
};

}  // namespace ember
