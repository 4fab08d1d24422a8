// Hyperparameters of the llama family from GGUF metadata ({arch}.block_count etc.).
#include <set>

#include "ember/status.h"
#include "model/model_impl.h"

namespace ember {

namespace {
// Architectures the llama forward covers; the value says whether rope rotates halves (neox).
bool arch_rope_neox(const std::string& arch, const std::string& path) {
    if (arch == "llama" || arch == "mistral") return false;
    if (arch == "qwen2") return true;
    fail(path, ": unsupported architecture '", arch, "' (general.architecture); supported: llama, mistral, qwen2");
}
}  // namespace

HParams read_hparams(const GGUFFile& f) {
    HParams hp;
    hp.arch = f.get_string("general.architecture");
    hp.rope_neox = arch_rope_neox(hp.arch, f.path());
    const std::string a = hp.arch + ".";
    hp.n_layer = (int32_t)f.get_uint(a + "block_count");
    hp.n_embd = (int32_t)f.get_uint(a + "embedding_length");
    hp.n_ff = (int32_t)f.get_uint(a + "feed_forward_length");
    hp.n_head = (int32_t)f.get_uint(a + "attention.head_count");
    hp.n_head_kv = (int32_t)f.get_uint(a + "attention.head_count_kv", (uint64_t)hp.n_head);
    hp.n_ctx_train = (int32_t)f.get_uint(a + "context_length", 2048);
    hp.rms_eps = (float)f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5);
    hp.rope_base = (float)f.get_float(a + "rope.freq_base", 10000.0);
    if (hp.n_layer <= 0 || hp.n_embd <= 0 || hp.n_ff <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0)
        fail(f.path(), ": hyperparameters must be positive (block_count ", hp.n_layer, ", embedding_length ",
             hp.n_embd, ", feed_forward_length ", hp.n_ff, ", head_count ", hp.n_head, ", head_count_kv ",
             hp.n_head_kv, ")");
    if (hp.n_embd % hp.n_head != 0 || hp.n_head % hp.n_head_kv != 0)
        fail(f.path(), ": ", a, "attention.head_count ", hp.n_head, " must divide embedding_length ", hp.n_embd,
             " and be a multiple of head_count_kv ", hp.n_head_kv);
    hp.head_dim = (int32_t)f.get_uint(a + "attention.key_length", (uint64_t)(hp.n_embd / hp.n_head));
    if (hp.head_dim % 2 != 0) fail(f.path(), ": head dimension ", hp.head_dim, " must be even for rope");
    return hp;
}

}  // namespace ember
