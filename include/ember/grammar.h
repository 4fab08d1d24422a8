// Constrained decoding: grammars (JSON schema, regex, Lark, llguidance's JSON form) compiled
// against a model's vocabulary by llguidance, whose C API is found at run time in the shared
// library load_llguidance names (the `llguidance` Python package's extension exports it).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ember {

class Tokenizer;

// Finds llguidance's C API in the shared library at path. Idempotent (a later path is ignored);
// throws InvalidInput naming the path or the missing function.
void load_llguidance(const std::string& path);
bool llguidance_loaded();

struct GrammarShared;
class Grammar;

// One sequence's grammar state: the tokens allowed next, as a bit mask (bit id % 32 of word id / 32).
class GrammarMatcher {
public:
    ~GrammarMatcher();
    GrammarMatcher(const GrammarMatcher&) = delete;
    GrammarMatcher& operator=(const GrammarMatcher&) = delete;
    const std::vector<uint32_t>& mask() const { return mask_; }
    // Takes a token the mask allowed and computes the next mask. False when the grammar refuses
    // it or fails (error() says why); the matcher then stays failed.
    bool advance(int32_t token);
    bool accepting() const;   // the grammar is complete here (end of generation allowed)
    bool stopped() const;     // nothing but end of generation can follow
    const std::string& error() const { return error_; }

private:
    friend class Grammar;
    GrammarMatcher(std::shared_ptr<const GrammarShared> shared, void* matcher, std::vector<uint32_t> mask);
    std::shared_ptr<const GrammarShared> shared_;
    void* m_;
    std::vector<uint32_t> mask_;
    std::string error_;
};

// A compiled grammar; immutable and shared: each matcher() is a fresh state at its start.
class Grammar {
public:
    ~Grammar();
    Grammar(const Grammar&) = delete;
    Grammar& operator=(const Grammar&) = delete;
    std::unique_ptr<GrammarMatcher> matcher() const;

private:
    friend class GrammarCompiler;
    Grammar(std::shared_ptr<const GrammarShared> shared, void* matcher, std::vector<uint32_t> mask);
    std::shared_ptr<const GrammarShared> shared_;
    void* template_;                  // never advanced; cloned per matcher
    std::vector<uint32_t> first_mask_;
    mutable std::mutex clone_mu_;     // requests from several threads copy one template
};

// The vocabulary as llguidance sees it (every token's bytes; control tokens and user-defined
// "<...>" ones as special tokens; the end-of-generation tokens as its EOS set) and a cache of the
// grammars compiled against it. Thread-safe. tok must outlive it and its grammars' matchers.
class GrammarCompiler {
public:
    // Throws InvalidInput when llguidance is not loaded or refuses the vocabulary.
    explicit GrammarCompiler(const Tokenizer& tok);
    ~GrammarCompiler();
    // kind: "llguidance" (its JSON grammar list), "lark", "json_schema", "json_object" or "regex".
    // Cached per (kind, text): a repeated grammar is not compiled again. Throws InvalidInput
    // naming llguidance's complaint about the grammar.
    std::shared_ptr<const Grammar> compile(const std::string& kind, const std::string& text);
    int32_t n_vocab() const;
    // The bytes llguidance holds for the tokens (special ones as their text), for tests.
    std::string decode(const std::vector<int32_t>& ids) const;
    size_t n_cached() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Sets the logits of the tokens mask does not allow to -inf (ids past the mask's bits included).
void apply_token_mask(float* logits, int32_t n_logits, const std::vector<uint32_t>& mask);

}  // namespace ember
