// Model::load: opens the GGUF, reads hyperparameters and the tokenizer, binds every block's
// tensors (shape-checked, as its architecture lists them) in place, and places blocks as the
// placement plan says.
#include <algorithm>
#include <cstdio>

#include "backend/registry.h"
#include "ember/status.h"
#include "model/model_impl.h"

namespace ember {

namespace {

const GGUFTensor& bind_tensor(const GGUFFile& f, const std::string& name, std::vector<int64_t> ne) {
    const GGUFTensor& t = f.tensor(name);
    if (t.ne != ne) {
        std::string want, got;
        for (auto d : ne) want += (want.empty() ? "" : ", ") + std::to_string(d);
        for (auto d : t.ne) got += (got.empty() ? "" : ", ") + std::to_string(d);
        fail(f.path(), ": tensor '", name, "' has shape [", got, "], expected [", want, "]");
    }
    return t;
}

const GGUFTensor* bind_optional(const GGUFFile& f, const std::string& name, std::vector<int64_t> ne) {
    return f.find_tensor(name) ? &bind_tensor(f, name, std::move(ne)) : nullptr;
}

// The tensor a spec names, or its rows (a part of a fused tensor: a view of the file's rows,
// kept in m.row_slices; of a vector, its elements); null for an absent optional one.
const GGUFTensor* bind_spec(ModelImpl& m, const GGUFFile& f, const std::string& name, const TensorSpec& s) {
    if (s.slice.of == 0) {
        // llama-quantize writes an [n, 1] tensor (qwen3next's ffn_gate_inp_shexp) as [n]: ggml drops trailing 1s
        const GGUFTensor* t = f.find_tensor(name);
        if (t && s.shape.size() == t->ne.size() + 1 && s.shape.back() == 1 &&
            std::equal(t->ne.begin(), t->ne.end(), s.shape.begin())) {
            GGUFTensor& whole = m.row_slices.emplace_back(*t);
            whole.ne = s.shape;
            return &whole;
        }
        return s.optional ? bind_optional(f, name, s.shape) : &bind_tensor(f, name, s.shape);
    }
    const bool vec = s.shape.size() == 1;
    const std::vector<int64_t> whole = vec ? std::vector<int64_t>{s.slice.of}
                                           : std::vector<int64_t>{s.shape[0], s.slice.of};
    const GGUFTensor* t = s.optional ? bind_optional(f, name, whole) : &bind_tensor(f, name, whole);
    if (!t) return nullptr;
    const size_t row = row_bytes(t->type, vec ? 1 : s.shape[0]);
    GGUFTensor& part = m.row_slices.emplace_back(*t);
    part.ne = s.shape;
    part.offset += row * s.slice.first;
    part.data += row * s.slice.first;
    part.nbytes = row * s.shape[vec ? 0 : 1];
    return &part;
}

// Block l's tensors without its MoE matrices (router, experts, shared expert); the MoE vectors
// stay, for batches that stream the matrices to the block's GPU (remote_experts.h).
BlockTensors without_moe_matrices(const ModelImpl& m, int32_t l) {
    BlockTensors t = m.blocks[l];
    for (int r = 0; r < kRoles; ++r)
        if (m.moe_role[r] && t.matrix(r)) t.t[r] = nullptr;
    return t;
}

}  // namespace

BlockWeights prepare_block_vectors(Backend& be, const BlockTensors& t) {
    BlockWeights w;
    w.backend = &be;
    for (int r = 0; r < kRoles; ++r)
        if (t.t[r] && !t.matrix(r)) w.vec[r] = be.prepare_vector(*t.t[r]);
    return w;
}

BlockWeights prepare_block(Backend& be, const BlockTensors& t) {
    BlockWeights w = prepare_block_vectors(be, t);
    for (int r = 0; r < kRoles; ++r)
        if (t.matrix(r)) w.mat[r] = be.prepare_weight(*t.t[r]);
    return w;
}

HeadWeights prepare_head(Backend& be, const GGUFTensor& output, const GGUFTensor& output_norm) {
    HeadWeights h;
    h.backend = &be;
    h.output = be.prepare_weight(output);
    h.output_norm = be.prepare_vector(output_norm);
    return h;
}

namespace {

// Per-pair frequency divisors (llama 3's rope_freqs.weight, LongRoPE's rope_factors_short/long.weight:
// [n_rot / 2] f32), empty when absent.
std::vector<float> read_freq_factors(const GGUFFile& f, const HParams& hp, const std::string& name) {
    const GGUFTensor* t = f.find_tensor(name);
    if (!t) return {};
    const int64_t n = hp.n_rot / 2;
    if (t->ne != std::vector<int64_t>{n} || t->type != GGMLType::F32)
        fail(f.path(), ": tensor '", name, "' must be F32 [", n, "] (rotated dimensions / 2)");
    const float* v = reinterpret_cast<const float*>(t->data);
    for (int64_t i = 0; i < n; ++i)
        if (!(v[i] > 0.0f)) fail(f.path(), ": ", name, "[", i, "] is ", v[i], ", must be positive");
    return std::vector<float>(v, v + n);
}

}  // namespace

std::shared_ptr<Model> Model::load(const std::string& path, const ModelParams& params) {
    std::shared_ptr<Model> model(new Model());
    model->impl_ = std::make_unique<ModelImpl>();
    ModelImpl& m = *model->impl_;
    m.params = params;
    m.file = std::make_unique<GGUFFile>(path);
    const GGUFFile& f = *m.file;
    m.hp = read_hparams(f);
    HParams& hp = m.hp;
    m.arch = &find_architecture(hp.arch, path);
    m.tokenizer = Tokenizer::from_gguf(f);

    const int64_t E = hp.n_embd;
    m.tok_embd = &f.tensor("token_embd.weight");
    if (m.tok_embd->ne.size() != 2 || m.tok_embd->ne[0] != E)
        fail(path, ": tensor 'token_embd.weight' must be [", E, ", n_vocab]");
    hp.n_vocab = (int32_t)m.tok_embd->ne[1];
    if (hp.n_vocab != m.tokenizer->n_vocab())
        fail(path, ": token_embd.weight has ", hp.n_vocab, " rows but the tokenizer has ", m.tokenizer->n_vocab(),
             " tokens");
    // Encoders have no output head (pooling and heads are Encoder's); some have no final norm.
    const bool encoder = m.arch->encoder();
    const char* norm = m.arch->output_norm_name();
    m.output_norm = encoder ? bind_optional(f, norm, {E}) : &bind_tensor(f, norm, {E});
    m.output = encoder ? nullptr : bind_optional(f, "output.weight", {E, hp.n_vocab});
    hp.tied_output = m.output == nullptr;
    if (hp.tied_output) m.output = m.tok_embd;
    if (hp.n_embd_per_layer > 0)
        m.per_layer_tok_embd = &bind_tensor(f, "per_layer_token_embd.weight",
                                            {(int64_t)hp.n_layer * hp.n_embd_per_layer, hp.n_vocab});

    const std::vector<float> factors_short = read_freq_factors(f, hp, "rope_factors_short.weight");
    const std::vector<float> factors_long = read_freq_factors(f, hp, "rope_factors_long.weight");
    if (factors_short.empty() != factors_long.empty())
        fail(path, ": LongRoPE needs both rope_factors_short.weight and rope_factors_long.weight");
    std::vector<float> factors = read_freq_factors(f, hp, "rope_freqs.weight");
    if (!factors.empty() && !factors_long.empty())
        fail(path, ": rope_freqs.weight and LongRoPE's rope_factors_short/long.weight cannot both be given");
    if (factors.empty()) factors = factors_short;
    const RopeParams rope = model_rope(hp, factors);
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        const std::vector<TensorSpec> specs = m.arch->layer_tensors(hp, l);
        const std::string p = "blk." + std::to_string(l) + ".";
        BlockTensors b;
        for (const TensorSpec& s : specs) {
            const int r = static_cast<int>(s.role);
            // An optional spec that finds nothing leaves an earlier one of its role bound (alternative names).
            const GGUFTensor* t = bind_spec(m, f, s.global ? std::string(s.name) : p + s.name, s);
            if (!t && b.t[r]) continue;
            b.t[r] = t;
            b.vector[r] = s.vector;
            m.moe_role[r] = is_moe_tensor(s.name);
        }
        m.blocks.push_back(b);
        m.layers.push_back(m.arch->layer_config(hp, l, rope));
        if (!factors_long.empty()) m.layers_long.push_back(m.arch->layer_config(hp, l, model_rope(hp, factors_long)));
    }

    // The GPU budget's default is the memory free on the GPU, so the backend starts before the plan.
    const bool have_gpu = backend_built("cuda");
    BackendOptions gpu_opts;
    gpu_opts.device = params.main_gpu;
    if (have_gpu && params.n_gpu_layers != 0) m.gpu = make_backend("cuda", gpu_opts);
    m.plan = plan_placement(f, hp.n_layer, params, have_gpu, m.gpu ? m.gpu->free_memory() : 0);
    if (m.plan.any_gpu() && !m.gpu) m.gpu = make_backend("cuda", gpu_opts);
    if (!m.plan.warning.empty()) std::fprintf(stderr, "ember: warning: %s\n", m.plan.warning.c_str());
    if (!have_gpu) m.params.n_gpu_layers = 0;   // what runs, as Model.n_gpu_layers reports it
    if (params.verbose || m.plan.any_experts_apart() || m.plan.gpu_budget)
        std::fprintf(stderr, "ember: %s\n", m.plan.summary.c_str());
    if (!m.plan.any_gpu()) m.gpu.reset();
    m.gpu_blocks.resize(hp.n_layer);
    m.stream_blocks.resize(hp.n_layer);
    if (m.plan.any_gpu()) {
        for (int32_t l = 0; l < hp.n_layer; ++l) {
            // Experts placed apart from their block are prepared on the CPU by the runner instead.
            if (m.plan.block[l] == Device::gpu)
                m.gpu_blocks[l] = prepare_block(*m.gpu,
                                                m.plan.experts_apart(l) ? without_moe_matrices(m, l) : m.blocks[l]);
            else m.stream_blocks[l] = prepare_block_vectors(*m.gpu, m.blocks[l]);
        }
        if (!encoder) m.gpu_head = prepare_head(*m.gpu, *m.output, *m.output_norm);
        m.gpu->synchronize();
    }
    if (!params.use_mmap) {
        // Everything the CPU reads after load (CPU blocks' matrices and vectors, the token
        // embeddings, a CPU head) comes from a huge-page copy: nothing reads the mapping again, so
        // the file may change or go once the model is loaded.
        std::vector<const GGUFTensor*> host;
        for (int32_t l = 0; l < hp.n_layer; ++l)
            for (int r = 0; r < kRoles; ++r)
                if (m.blocks[l].t[r] && (m.plan.block[l] == Device::cpu ||
                                         (m.plan.experts_apart(l) && (m.moe_role[r] || !m.blocks[l].matrix(r)))))
                    host.push_back(m.blocks[l].t[r]);
        host.push_back(m.tok_embd);
        if (m.per_layer_tok_embd) host.push_back(m.per_layer_tok_embd);
        if (m.plan.head == Device::cpu && !encoder) {
            host.push_back(m.output);
            host.push_back(m.output_norm);
        }
        m.host_weights = std::make_unique<HostWeights>(host);
        for (BlockTensors& b : m.blocks)
            for (int r = 0; r < kRoles; ++r)
                if (b.t[r]) b.t[r] = m.host_weights->find(b.t[r]);
        m.tok_embd = m.host_weights->find(m.tok_embd);
        if (m.per_layer_tok_embd) m.per_layer_tok_embd = m.host_weights->find(m.per_layer_tok_embd);
        if (!encoder) {
            m.output = m.host_weights->find(m.output);
            m.output_norm = m.host_weights->find(m.output_norm);
        }
        if (params.verbose)
            std::fprintf(stderr, "ember: %s: %.1f MiB of CPU weights copied to host memory (%s)\n", path.c_str(),
                         m.host_weights->bytes() / 1048576.0,
                         m.host_weights->huge_pages() ? "transparent huge pages" : "no huge pages");
    }
    if (params.verbose)
        std::fprintf(stderr, "ember: %s: arch %s, %d blocks (%d on GPU), n_embd %d, n_head %d/%d, vocab %d\n",
                     path.c_str(), hp.arch.c_str(), hp.n_layer, m.plan.n_gpu_blocks, hp.n_embd, hp.n_head, hp.n_head_kv,
                     hp.n_vocab);
    return model;
}

Model::~Model() = default;
const HParams& Model::hparams() const { return impl_->hp; }
const Tokenizer& Model::tokenizer() const { return *impl_->tokenizer; }
const GGUFFile& Model::file() const { return *impl_->file; }
const ModelParams& Model::params() const { return impl_->params; }

}  // namespace ember
