// Grammars through llguidance's C API (include/ember/grammar.h): the API's functions found at run
// time, the vocabulary handed to it, compiled grammars cached and cloned per sequence.
#include "ember/grammar.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <list>
#include <map>
#include <mutex>

#include "ember/status.h"
#include "ember/tokenizer.h"

namespace ember {

namespace {

// llguidance's C API as its header lays it out (the fields ember sets and those before them).
struct LlgTokenizer;
struct LlgMatcher;
struct LlgParserLimits {
    size_t max_items_in_row;
    uint64_t initial_lexer_fuel, step_lexer_fuel;
    size_t step_max_items, max_lexer_states, max_grammar_size;
    bool precompute_large_lexemes, verbose_errors;
};
struct LlgConstraintInit {
    const LlgTokenizer* tokenizer;
    uint32_t log_buffer_level, log_stderr_level;
    bool ff_tokens_ok, backtrack_ok;
    LlgParserLimits limits;
};
using LlgTokenizeFn = size_t (*)(const void* user, const uint8_t* bytes, size_t n_bytes, uint32_t* out, size_t n_out);
// Versioned by struct_size: the library reads only the fields the caller knows.
struct LlgTokenizerInitV2 {
    size_t struct_size;
    uint32_t vocab_size, tok_eos;
    const uint32_t* token_lens;
    const uint8_t* token_bytes;
    const char* tokenizer_json;
    bool tokenize_assumes_string;
    LlgTokenizeFn tokenize_fn;
    bool use_approximate_greedy_tokenize_fn;
    const void* tokenize_user_data;
    const char* const* slices;
    const uint32_t* tok_eos_extra;
    uint32_t tok_eos_extra_count;
};

struct Api {
    LlgTokenizer* (*new_tokenizer_v2)(const LlgTokenizerInitV2*, char*, size_t);
    void (*free_tokenizer)(LlgTokenizer*);
    void (*constraint_init_set_defaults)(LlgConstraintInit*, const LlgTokenizer*);
    LlgMatcher* (*new_matcher)(const LlgConstraintInit*, const char*, const char*);
    const char* (*matcher_get_error)(LlgMatcher*);
    int32_t (*matcher_compute_mask_into)(LlgMatcher*, uint32_t*, size_t);
    size_t (*matcher_get_mask_byte_size)(const LlgMatcher*);
    int32_t (*matcher_consume_token)(LlgMatcher*, uint32_t);
    bool (*matcher_is_accepting)(LlgMatcher*);
    bool (*matcher_is_stopped)(const LlgMatcher*);
    LlgMatcher* (*clone_matcher)(const LlgMatcher*);
    void (*free_matcher)(LlgMatcher*);
    size_t (*decode_tokens)(const LlgTokenizer*, const uint32_t*, size_t, char*, size_t, uint32_t);
};

std::mutex g_load_mu;
Api g_api;
bool g_loaded = false;

const Api& api() {
    if (!g_loaded)
        fail(
            "constrained decoding needs llguidance (pip install llguidance): it was not loaded "
            "(ember.structured loads it; C++ callers: ember::load_llguidance)");
    return g_api;
}

LlgMatcher* as_matcher(void* p) { return static_cast<LlgMatcher*>(p); }

constexpr uint32_t kDecodeIncludeSpecial = 1;
// llguidance reads a token whose bytes start with 0xFF as a special token named by the rest (so
// a byte token 0xFF, which no UTF-8 text holds, is a nameless special token to it).
constexpr char kSpecialMarker = '\xff';

// The bytes of a token as llguidance should see them: what ember decodes it to, special tokens
// behind the marker (a grammar's text then never matches them; Lark names them by their text).
std::string token_bytes(const Tokenizer& tok, int32_t id) {
    if (!tok.is_special(id)) return tok.token_to_piece(id, false);
    const std::string& text = tok.token_text(id);
    return kSpecialMarker + (text.empty() ? "<[" + std::to_string(id) + "]>" : text);
}

// llguidance's tokenize callback: ember's encoder on plain text (no BOS, no special tokens, no
// space prefix). llguidance forces the tokens it gives for text a grammar forces.
size_t tokenize_with(const void* user, const uint8_t* bytes, size_t n_bytes, uint32_t* out, size_t n_out) {
    const Tokenizer& tok = *static_cast<const Tokenizer*>(user);
    const std::vector<int32_t> ids = tok.encode_plain(std::string(reinterpret_cast<const char*>(bytes), n_bytes));
    for (size_t i = 0; i < ids.size() && i < n_out; ++i) out[i] = uint32_t(ids[i]);
    return ids.size();
}

// Whether ember's plain encoder gives back exactly the bytes it is handed (a WordPiece vocabulary's
// does not): llguidance then tokenizes forced text with it, else greedily over the vocabulary.
bool encodes_exactly(const Tokenizer& tok) {
    for (const std::string probe : {"x = {\"ab\": [1, 2]} and More", " {\"a\": 1}"}) {
        std::string back;
        for (int32_t id : tok.encode_plain(probe)) back += tok.token_to_piece(id, false);
        if (back != probe) return false;
    }
    return true;
}

}  // namespace

void load_llguidance(const std::string& path) {
    std::lock_guard<std::mutex> lk(g_load_mu);
    if (g_loaded) return;
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) fail("load_llguidance: cannot open '", path, "': ", dlerror());
    Api a{};
    auto sym = [&](auto& fn, const char* name) {
        void* p = dlsym(lib, name);
        if (!p) fail("load_llguidance: '", path, "' has no function ", name, " (not llguidance's library, or too old)");
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    sym(a.new_tokenizer_v2, "llg_new_tokenizer_v2");
    sym(a.free_tokenizer, "llg_free_tokenizer");
    sym(a.constraint_init_set_defaults, "llg_constraint_init_set_defaults");
    sym(a.new_matcher, "llg_new_matcher");
    sym(a.matcher_get_error, "llg_matcher_get_error");
    sym(a.matcher_compute_mask_into, "llg_matcher_compute_mask_into");
    sym(a.matcher_get_mask_byte_size, "llg_matcher_get_mask_byte_size");
    sym(a.matcher_consume_token, "llg_matcher_consume_token");
    sym(a.matcher_is_accepting, "llg_matcher_is_accepting");
    sym(a.matcher_is_stopped, "llg_matcher_is_stopped");
    sym(a.clone_matcher, "llg_clone_matcher");
    sym(a.free_matcher, "llg_free_matcher");
    sym(a.decode_tokens, "llg_decode_tokens");
    g_api = a;
    g_loaded = true;   // the library stays open for the process's life: matchers may outlive anything
}

bool llguidance_loaded() {
    std::lock_guard<std::mutex> lk(g_load_mu);
    return g_loaded;
}

// What every grammar of one compiler shares: llguidance's tokenizer (freed after the last of them).
struct GrammarShared {
    LlgTokenizer* tok = nullptr;
    int32_t n_vocab = 0;
    size_t mask_words = 0;
    ~GrammarShared() {
        if (tok) g_api.free_tokenizer(tok);
    }
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const GrammarShared> shared, void* matcher, std::vector<uint32_t> mask)
    : shared_(std::move(shared)), m_(matcher), mask_(std::move(mask)) {}

GrammarMatcher::~GrammarMatcher() { g_api.free_matcher(as_matcher(m_)); }

bool GrammarMatcher::advance(int32_t token) {
    if (!error_.empty()) return false;
    const Api& a = g_api;
    LlgMatcher* m = as_matcher(m_);
    if (token < 0 || token >= shared_->n_vocab || !(mask_[size_t(token) / 32] >> (token % 32) & 1u)) {
        error_ = cat("grammar: token ", token, " is not allowed here");
        return false;
    }
    if (a.matcher_consume_token(m, uint32_t(token)) != 0 ||
        a.matcher_compute_mask_into(m, mask_.data(), mask_.size() * sizeof(uint32_t)) != 0) {
        const char* e = a.matcher_get_error(m);
        error_ = cat("grammar: ", e ? e : "llguidance failed");
        return false;
    }
    return true;
}

bool GrammarMatcher::accepting() const { return error_.empty() && g_api.matcher_is_accepting(as_matcher(m_)); }
bool GrammarMatcher::stopped() const { return g_api.matcher_is_stopped(as_matcher(m_)); }

Grammar::Grammar(std::shared_ptr<const GrammarShared> shared, void* matcher, std::vector<uint32_t> mask)
    : shared_(std::move(shared)), template_(matcher), first_mask_(std::move(mask)) {}

Grammar::~Grammar() { g_api.free_matcher(as_matcher(template_)); }

std::unique_ptr<GrammarMatcher> Grammar::matcher() const {
    LlgMatcher* m;
    {
        std::lock_guard<std::mutex> lk(clone_mu_);
        m = g_api.clone_matcher(as_matcher(template_));
    }
    if (!m) fail("grammar: llguidance could not copy the compiled grammar");
    return std::unique_ptr<GrammarMatcher>(new GrammarMatcher(shared_, m, first_mask_));
}

struct GrammarCompiler::Impl {
    const Tokenizer& tok;
    std::shared_ptr<GrammarShared> shared;
    mutable std::mutex mu;
    std::map<std::string, std::shared_ptr<const Grammar>> cache;
    std::list<std::string> order;   // oldest first: the cache keeps the last kMaxCached
    static constexpr size_t kMaxCached = 256;
    explicit Impl(const Tokenizer& t) : tok(t) {}
};

GrammarCompiler::GrammarCompiler(const Tokenizer& tok) : impl_(std::make_unique<Impl>(tok)) {
    const Api& a = api();
    const int32_t n = tok.n_vocab();
    std::vector<uint32_t> lens((size_t)n);
    std::string bytes;
    std::vector<uint32_t> eog;
    for (int32_t id = 0; id < n; ++id) {
        const std::string b = token_bytes(tok, id);
        lens[(size_t)id] = uint32_t(b.size());
        bytes += b;
        if (tok.is_eog(id)) eog.push_back(uint32_t(id));
    }
    if (eog.empty()) fail("constrained decoding needs an end-of-generation token, and this vocabulary has none");
    LlgTokenizerInitV2 init{};
    init.struct_size = sizeof(init);
    init.vocab_size = uint32_t(n);
    init.tok_eos = eog[0];
    init.token_lens = lens.data();
    init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
    if (encodes_exactly(tok)) {
        init.tokenize_fn = tokenize_with;
        init.tokenize_user_data = &tok;
        // ember's encoder turns invalid UTF-8 (the rest of a character a grammar forces) into U+FFFD.
        init.tokenize_assumes_string = true;
    } else {
        init.use_approximate_greedy_tokenize_fn = true;
    }
    init.tok_eos_extra = eog.data() + 1;
    init.tok_eos_extra_count = uint32_t(eog.size() - 1);
    char err[1024] = {0};
    LlgTokenizer* t = a.new_tokenizer_v2(&init, err, sizeof(err));
    if (!t) fail("llguidance refused the vocabulary: ", err);
    impl_->shared = std::make_shared<GrammarShared>();
    impl_->shared->tok = t;
    impl_->shared->n_vocab = n;
    impl_->shared->mask_words = (size_t(n) + 31) / 32;
}

GrammarCompiler::~GrammarCompiler() = default;

int32_t GrammarCompiler::n_vocab() const { return impl_->shared->n_vocab; }

size_t GrammarCompiler::n_cached() const {
    std::lock_guard<std::mutex> lk(impl_->mu);
    return impl_->cache.size();
}

std::shared_ptr<const Grammar> GrammarCompiler::compile(const std::string& kind, const std::string& text) {
    static const char* const kinds[] = {"llguidance", "lark", "json_schema", "json_object", "regex"};
    if (std::find(std::begin(kinds), std::end(kinds), kind) == std::end(kinds))
        fail("grammar kind must be llguidance, lark, json_schema, json_object or regex, got '", kind, "'");
    const std::string key = kind + '\0' + text;
    {
        std::lock_guard<std::mutex> lk(impl_->mu);
        auto it = impl_->cache.find(key);
        if (it != impl_->cache.end()) return it->second;
    }
    const Api& a = api();
    const GrammarShared& sh = *impl_->shared;
    // Room past the fields ember knows, for any the library's version appends.
    struct {
        LlgConstraintInit init;
        char spare[256];
    } buf{};
    a.constraint_init_set_defaults(&buf.init, sh.tok);
    buf.init.log_stderr_level = 0;   // warnings go nowhere: an error comes back as an exception
    LlgMatcher* m = a.new_matcher(&buf.init, kind.c_str(), text.c_str());
    if (const char* e = a.matcher_get_error(m)) {
        const std::string msg = e;
        a.free_matcher(m);
        fail("invalid ", kind == "llguidance" ? "grammar" : kind, ": ", msg);
    }
    if (a.matcher_get_mask_byte_size(m) != sh.mask_words * sizeof(uint32_t)) {
        a.free_matcher(m);
        fail("llguidance's token mask is not the vocabulary's size");
    }
    std::vector<uint32_t> mask(sh.mask_words);
    if (a.matcher_compute_mask_into(m, mask.data(), mask.size() * sizeof(uint32_t)) != 0) {
        const char* e = a.matcher_get_error(m);
        const std::string msg = e ? e : "llguidance failed";
        a.free_matcher(m);
        fail("invalid ", kind, ": ", msg);
    }
    std::shared_ptr<const Grammar> g(new Grammar(impl_->shared, m, std::move(mask)));
    std::lock_guard<std::mutex> lk(impl_->mu);
    auto [it, added] = impl_->cache.emplace(key, g);
    if (added) {
        impl_->order.push_back(key);
        if (impl_->order.size() > Impl::kMaxCached) {
            impl_->cache.erase(impl_->order.front());
            impl_->order.pop_front();
        }
    }
    return it->second;
}

std::string GrammarCompiler::decode(const std::vector<int32_t>& ids) const {
    const Api& a = api();
    std::vector<uint32_t> u(ids.begin(), ids.end());
    for (int32_t id : ids)
        if (id < 0 || id >= impl_->shared->n_vocab) fail("decode: token id ", id, " is out of range");
    const size_t n = a.decode_tokens(impl_->shared->tok, u.data(), u.size(), nullptr, 0, kDecodeIncludeSpecial);
    // n counts the terminating NUL it writes.
    std::string out(n + 1, '\0');
    a.decode_tokens(impl_->shared->tok, u.data(), u.size(), out.data(), out.size(), kDecodeIncludeSpecial);
    out.resize(n > 0 ? n - 1 : 0);
    return out;
}

void apply_token_mask(float* logits, int32_t n_logits, const std::vector<uint32_t>& mask) {
    const int32_t n_bits = int32_t(mask.size() * 32);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int32_t i = 0; i < n_logits; ++i)
        if (i >= n_bits || !(mask[size_t(i) / 32] >> (i % 32) & 1u)) logits[i] = neg_inf;
}

}  // namespace ember
