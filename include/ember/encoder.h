// Encoder models (BERT, nomic-bert, EmbeddingGemma and the cross-encoder rerankers): whole
// sequences packed into forwards with bidirectional attention and no KV cache, pooled as the
// GGUF's {arch}.pooling_type says (or the caller), through the model's head (the rank classifier,
// EmbeddingGemma's dense layers).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ember/model.h"

namespace ember {

// llama.cpp's enum llama_pooling_type.
enum class Pooling : int32_t { unspecified = -1, none = 0, mean = 1, cls = 2, last = 3, rank = 4 };

struct EncoderParams {
    int32_t n_batch = kDefaultBatchTokens;   // most tokens of one forward (every sequence must fit in one)
    int32_t n_threads = 0;                   // 0: all hardware threads
    Pooling pooling = Pooling::unspecified;  // unspecified: the file's {arch}.pooling_type (mean where absent)
};

struct EncoderImpl;

// Not thread-safe; Encoders of one model share its GPU backend (the batch it runs), so one encode
// at a time per model.
class Encoder {
public:
    // Throws InvalidInput when the model is no encoder, or the pooling needs a head it lacks.
    Encoder(std::shared_ptr<Model> model, const EncoderParams& params);
    ~Encoder();
    // Runs every sequence whole, packed into forwards of up to n_batch tokens. types: per-token
    // type ids (BERT's segment A / B), empty for all 0. Returns [n_seq][n_out()] pooled rows, not
    // normalized (rank: the classifier's raw scores); with Pooling::none every token's row,
    // [sum of lengths][n_embd]. Throws InvalidInput naming a sequence that is empty, too long or
    // holds an id out of range.
    std::vector<float> encode(const std::vector<std::vector<int32_t>>& seqs,
                              const std::vector<std::vector<int32_t>>& types = {});
    Pooling pooling() const;
    int32_t n_out() const;    // n_embd (after any dense layers), or the classifier's outputs (rank)
    int32_t n_batch() const;
    const Model& model() const;

private:
    std::unique_ptr<EncoderImpl> impl_;
};

// The rows of cls.output.weight (a rank classifier's outputs); 0 when the model has none.
int32_t classifier_outputs(const Model& model);

}  // namespace ember
