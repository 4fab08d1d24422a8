// Hyperparameters from GGUF metadata: the keys every architecture has ({arch}.block_count etc.,
// rope scaling), then the architecture's own (model/arch).
#include <algorithm>
#include <cmath>
#include <optional>

#include "ember/status.h"
#include "model/arch/arch.h"
#include "model/model_impl.h"

namespace ember {

namespace {

// The mixture keys every architecture spells alike; whether a model must or may have experts is
// its architecture's to say.
void read_expert_hparams(const GGUFFile& f, const std::string& a, HParams& hp) {
    const uint64_t n_expert = f.get_uint(a + "expert_count", 0);
    const uint64_t n_used = f.get_uint(a + "expert_used_count", 0);
    if (n_expert == 0) {
        if (n_used != 0) fail(f.path(), ": ", a, "expert_used_count ", n_used, " without ", a, "expert_count");
        return;
    }
    if (n_expert > 4096) fail(f.path(), ": ", a, "expert_count ", n_expert, " is out of range (at most 4096)");
    if (n_used == 0 || n_used > n_expert)
        fail(f.path(), ": ", a, "expert_used_count ", n_used, " must be between 1 and ", a, "expert_count (", n_expert,
             ")");
    hp.n_expert = (int32_t)n_expert;
    hp.n_expert_used = (int32_t)n_used;
    hp.n_ff_exp = (int32_t)f.get_uint(a + "expert_feed_forward_length", (uint64_t)hp.n_ff);
    if (hp.n_ff_exp <= 0) fail(f.path(), ": ", a, "expert_feed_forward_length must be positive, got ", hp.n_ff_exp);
    hp.expert_weights_norm = f.get_bool(a + "expert_weights_norm", true);
    hp.expert_weights_scale = (float)f.get_float(a + "expert_weights_scale", 1.0);
    if (!(hp.expert_weights_scale > 0.0f))
        fail(f.path(), ": ", a, "expert_weights_scale must be positive, got ", hp.expert_weights_scale);
}

// key as one count, or one a layer (llama.cpp's converter writes arrays where Gemma 4's layers
// differ): the layers' values go to per_layer and the largest is returned; dflt where the key is
// absent (none: required).
int32_t layer_counts(const GGUFFile& f, const std::string& key, int32_t n_layer, std::vector<int32_t>& per_layer,
                     std::optional<uint64_t> dflt = std::nullopt) {
    const GGUFValue* v = f.find(key);
    if (!v || v->type != GGUFType::ARRAY) return (int32_t)(dflt ? f.get_uint(key, *dflt) : f.get_uint(key));
    if ((int64_t)v->arr.size() != n_layer ||
        std::any_of(v->arr.begin(), v->arr.end(), [](const GGUFValue& x) { return !x.is_integer(); }))
        fail(f.path(), ": ", key, " must be a count or ", n_layer, " integers, got ", v->arr.size(), " values");
    for (const GGUFValue& x : v->arr) per_layer.push_back((int32_t)x.num.u);
    return *std::max_element(per_layer.begin(), per_layer.end());
}

}  // namespace

HParams read_hparams(const GGUFFile& f) {
    HParams hp;
    hp.arch = f.get_string("general.architecture");
    const Architecture& arch = find_architecture(hp.arch, f.path());
    const std::string a = hp.arch + ".";
    hp.n_layer = (int32_t)f.get_uint(a + "block_count");
    hp.n_embd = (int32_t)f.get_uint(a + "embedding_length");
    hp.n_ff = layer_counts(f, a + "feed_forward_length", hp.n_layer, hp.n_ff_layer);
    hp.n_head = (int32_t)f.get_uint(a + "attention.head_count");
    hp.n_head_kv = layer_counts(f, a + "attention.head_count_kv", hp.n_layer, hp.n_head_kv_layer, (uint64_t)hp.n_head);
    hp.n_ctx_train = (int32_t)f.get_uint(a + "context_length", 2048);
    hp.rms_eps = (float)f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5);
    hp.rope_base = (float)f.get_float(a + "rope.freq_base", 10000.0);
    if (hp.n_layer <= 0 || hp.n_embd <= 0 || hp.n_ff <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0)
        fail(f.path(), ": hyperparameters must be positive (block_count ", hp.n_layer, ", embedding_length ", hp.n_embd,
             ", feed_forward_length ", hp.n_ff, ", head_count ", hp.n_head, ", head_count_kv ", hp.n_head_kv, ")");
    // A 0 in a per-layer head_count_kv marks a layer without attention, and one in a per-layer
    // feed_forward_length a layer without a feed-forward (llama.cpp's hybrid files): checked against
    // the architecture's layers after read_hparams.
    for (int32_t l = 0; l < hp.n_layer; ++l)
        if (hp.layer_n_head_kv(l) < 0 || (hp.layer_n_head_kv(l) > 0 && hp.n_head % hp.layer_n_head_kv(l) != 0))
            fail(f.path(), ": ", a, "attention.head_count ", hp.n_head, " must be a multiple of head_count_kv ",
                 hp.layer_n_head_kv(l), " (layer ", l, ")");
    for (int32_t l = 0; l < hp.n_layer; ++l)
        if (hp.layer_n_ff(l) < 0)
            fail(f.path(), ": ", a, "feed_forward_length of layer ", l, " must be positive, got ", hp.layer_n_ff(l));
    const bool own_head_dim = f.find(a + "attention.key_length") != nullptr;
    if (!own_head_dim && hp.n_embd % hp.n_head != 0)
        fail(f.path(), ": ", a, "attention.head_count ", hp.n_head, " must divide embedding_length ", hp.n_embd,
             " (or the file must give attention.key_length)");
    hp.head_dim = (int32_t)f.get_uint(a + "attention.key_length", (uint64_t)(hp.n_embd / hp.n_head));
    if (hp.head_dim <= 0 || hp.head_dim % 2 != 0)
        fail(f.path(), ": head dimension ", hp.head_dim, " must be positive and even for rope");
    const int64_t v_len = (int64_t)f.get_uint(a + "attention.value_length", (uint64_t)hp.head_dim);

    // Rope scaling. llama 3's comes as the rope_freqs.weight tensor (read with the tensors).
    hp.rope_scaling = f.get_string(a + "rope.scaling.type", "none");
    double factor = f.get_float(a + "rope.scaling.factor", 0.0);
    if (factor == 0.0) factor = f.get_float(a + "rope.scale_linear", 0.0);
    if (hp.rope_scaling == "linear" || hp.rope_scaling == "yarn") {
        if (!(factor > 0.0))
            fail(f.path(), ": ", a, "rope.scaling.type '", hp.rope_scaling, "' needs a positive ", a,
                 "rope.scaling.factor, got ", factor);
        hp.rope_freq_scale = (float)(1.0 / factor);
    } else if (hp.rope_scaling != "none") {
        fail(f.path(), ": ", a, "rope.scaling.type '", hp.rope_scaling, "' is not supported (none, linear, yarn)");
    } else if (factor > 0.0) {
        hp.rope_freq_scale = (float)(1.0 / factor);   // an old file's rope.scale_linear alone
    }
    hp.rope_n_ctx_orig = (int32_t)f.get_uint(a + "rope.scaling.original_context_length", (uint64_t)hp.n_ctx_train);
    hp.n_rot = (int32_t)f.get_uint(a + "rope.dimension_count", (uint64_t)hp.head_dim);
    if (hp.n_rot <= 0 || hp.n_rot % 2 != 0 || hp.n_rot > hp.head_dim)
        fail(f.path(), ": ", a, "rope.dimension_count ", hp.n_rot,
             " must be even and between 2 and the head dimension ", hp.head_dim);
    hp.rope_attn_factor = (float)f.get_float(a + "rope.scaling.attn_factor", 1.0);
    if (!(hp.rope_attn_factor > 0.0f))
        fail(f.path(), ": ", a, "rope.scaling.attn_factor must be positive, got ", hp.rope_attn_factor);
    if (hp.rope_scaling == "yarn") {
        hp.yarn_ext_factor = (float)f.get_float(a + "rope.scaling.yarn_ext_factor", 1.0);
        // llama.cpp's converter writes yarn_attn_factor; older files attn_factor.
        hp.yarn_attn_factor = (float)f.get_float(a + "rope.scaling.yarn_attn_factor",
                                                 f.get_float(a + "rope.scaling.attn_factor", 1.0));
        hp.yarn_beta_fast = (float)f.get_float(a + "rope.scaling.yarn_beta_fast", 32.0);
        hp.yarn_beta_slow = (float)f.get_float(a + "rope.scaling.yarn_beta_slow", 1.0);
        hp.yarn_log_mul = (float)f.get_float(a + "rope.scaling.yarn_log_multiplier", 0.0);
        if (hp.yarn_log_mul != 0.0f) {
            // As llama.cpp: the magnitude is mscale(factor, 1) / mscale(factor, log_mul) times the
            // file's attn_factor, with rope's own 1 + 0.1 ln(factor) divided out.
            const double factor = 1.0 / hp.rope_freq_scale;
            auto mscale = [&](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
            hp.yarn_attn_factor = (float)(mscale(1.0) / mscale(hp.yarn_log_mul) / (1.0 + 0.1 * std::log(factor)) *
                                          hp.rope_attn_factor);
        }
    }
    read_expert_hparams(f, a, hp);
    arch.read_hparams(f, hp);
    // Architectures whose values are their cached keys (latent attention) check the value length themselves.
    if (v_len != hp.head_dim && !hp.kv_values_are_keys)
        fail(f.path(), ": ", a, "attention.value_length ", v_len, " differs from key_length ", hp.head_dim,
             "; ember needs equal key and value head sizes");
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        if (hp.layer_n_head_kv(l) == 0 && arch.layer_attends(hp, l))
            fail(f.path(), ": ", a, "attention.head_count_kv is 0 for layer ", l, ", which ", hp.arch,
                 " makes an attention layer (not a recurrent one)");
        if (hp.layer_n_ff(l) == 0 && arch.layer_has_ffn(hp, l))
            fail(f.path(), ": ", a, "feed_forward_length is 0 for layer ", l, ", which ", hp.arch,
                 " gives a feed-forward");
    }
    if (hp.swa_layer.empty()) hp.swa_layer.assign(hp.n_layer, false);
    return hp;
}

RopeParams model_rope(const HParams& hp, const std::vector<float>& freq_factors) {
    RopeParams r;
    r.base = hp.rope_base;
    r.head_dim = hp.head_dim;
    r.n_rot = hp.n_rot == hp.head_dim ? 0 : hp.n_rot;
    r.neox = hp.rope_neox;
    r.freq_scale = hp.rope_freq_scale;
    r.freq_factors = freq_factors;
    r.attn_factor = hp.rope_attn_factor;
    if (hp.attn_temp_scale != 0.0f) {
        r.temp_scale = hp.attn_temp_scale;
        r.temp_length = hp.rope_n_ctx_orig;
    }
    if (hp.rope_scaling == "yarn") {
        r.ext_factor = hp.yarn_ext_factor;
        r.attn_factor = hp.yarn_attn_factor;
        rope_yarn_corr_dims(r.rotated(), hp.rope_n_ctx_orig, hp.rope_base, hp.yarn_beta_fast, hp.yarn_beta_slow,
                            r.corr_lo, r.corr_hi);
        if (!hp.yarn_rounded) {
            // The same range before rounding (gpt-oss's reference and transformers' truncate=false).
            const double pi = 3.14159265358979323846;
            auto dim = [&](double n_rot) {
                return r.rotated() * std::log(hp.rope_n_ctx_orig / (n_rot * 2 * pi)) / (2 * std::log(hp.rope_base));
            };
            r.corr_lo = (float)std::max(0.0, dim(hp.yarn_beta_fast));
            r.corr_hi = (float)std::min((double)(r.rotated() - 1), dim(hp.yarn_beta_slow));
        }
    }
    return r;
}

}  // namespace ember
