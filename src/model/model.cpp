// Model::load: opens the GGUF, reads hyperparameters and the tokenizer, binds every block's
// tensors (shape-checked) in place, and places blocks: the last n_gpu_layers on the GPU.
#include <cstdio>

#include "ember/status.h"
#include "model/model_impl.h"

namespace ember {

namespace {

const GGUFTensor& bind(const GGUFFile& f, const std::string& name, std::vector<int64_t> ne) {
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
    return f.find_tensor(name) ? &bind(f, name, std::move(ne)) : nullptr;
}

}  // namespace

BlockWeights prepare_block_vectors(Backend& be, const BlockTensors& t) {
    BlockWeights w;
    w.backend = &be;
    w.attn_norm = be.prepare_vector(*t.attn_norm);
    w.ffn_norm = be.prepare_vector(*t.ffn_norm);
    if (t.bq) w.bq = be.prepare_vector(*t.bq);
    if (t.bk) w.bk = be.prepare_vector(*t.bk);
    if (t.bv) w.bv = be.prepare_vector(*t.bv);
    return w;
}

BlockWeights prepare_block(Backend& be, const BlockTensors& t) {
    BlockWeights w = prepare_block_vectors(be, t);
    w.wq = be.prepare_weight(*t.wq);
    w.wk = be.prepare_weight(*t.wk);
    w.wv = be.prepare_weight(*t.wv);
    w.wo = be.prepare_weight(*t.wo);
    w.w_gate = be.prepare_weight(*t.w_gate);
    w.w_up = be.prepare_weight(*t.w_up);
    w.w_down = be.prepare_weight(*t.w_down);
    return w;
}

HeadWeights prepare_head(Backend& be, const GGUFTensor& output, const GGUFTensor& output_norm) {
    HeadWeights h;
    h.backend = &be;
    h.output = be.prepare_weight(output);
    h.output_norm = be.prepare_vector(output_norm);
    return h;
}

std::shared_ptr<Model> Model::load(const std::string& path, const ModelParams& params) {
    std::shared_ptr<Model> model(new Model());
    model->impl_ = std::make_unique<ModelImpl>();
    ModelImpl& m = *model->impl_;
    m.params = params;
    m.file = std::make_unique<GGUFFile>(path);
    const GGUFFile& f = *m.file;
    m.hp = read_hparams(f);
    HParams& hp = m.hp;
    m.tokenizer = Tokenizer::from_gguf(f);

    const int64_t E = hp.n_embd, F = hp.n_ff, D = hp.head_dim;
    const int64_t QW = hp.n_head * D, KW = hp.n_head_kv * D;
    m.tok_embd = &f.tensor("token_embd.weight");
    if (m.tok_embd->ne.size() != 2 || m.tok_embd->ne[0] != E)
        fail(path, ": tensor 'token_embd.weight' must be [", E, ", n_vocab]");
    hp.n_vocab = (int32_t)m.tok_embd->ne[1];
    if (hp.n_vocab != m.tokenizer->n_vocab())
        fail(path, ": token_embd.weight has ", hp.n_vocab, " rows but the tokenizer has ",
             m.tokenizer->n_vocab(), " tokens");
    m.output_norm = &bind(f, "output_norm.weight", {E});
    m.output = bind_optional(f, "output.weight", {E, hp.n_vocab});
    hp.tied_output = m.output == nullptr;
    if (hp.tied_output) m.output = m.tok_embd;

    for (int32_t l = 0; l < hp.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        BlockTensors b;
        b.attn_norm = &bind(f, p + "attn_norm.weight", {E});
        b.wq = &bind(f, p + "attn_q.weight", {E, QW});
        b.wk = &bind(f, p + "attn_k.weight", {E, KW});
        b.wv = &bind(f, p + "attn_v.weight", {E, KW});
        b.wo = &bind(f, p + "attn_output.weight", {QW, E});
        b.bq = bind_optional(f, p + "attn_q.bias", {QW});
        b.bk = bind_optional(f, p + "attn_k.bias", {KW});
        b.bv = bind_optional(f, p + "attn_v.bias", {KW});
        b.ffn_norm = &bind(f, p + "ffn_norm.weight", {E});
        b.w_gate = &bind(f, p + "ffn_gate.weight", {E, F});
        b.w_up = &bind(f, p + "ffn_up.weight", {E, F});
        b.w_down = &bind(f, p + "ffn_down.weight", {F, E});
        m.blocks.push_back(b);
    }

    const int32_t n_gpu = params.n_gpu_layers < 0 ? hp.n_layer : std::min(params.n_gpu_layers, hp.n_layer);
    m.on_gpu.assign(hp.n_layer, false);
    for (int32_t l = hp.n_layer - n_gpu; l < hp.n_layer; ++l) m.on_gpu[l] = true;
    m.gpu_blocks.resize(hp.n_layer);
    m.stream_blocks.resize(hp.n_layer);
    if (n_gpu > 0) {
        m.gpu = make_cuda_backend(params.main_gpu);
        for (int32_t l = 0; l < hp.n_layer; ++l) {
            if (m.on_gpu[l]) m.gpu_blocks[l] = prepare_block(*m.gpu, m.blocks[l]);
            else m.stream_blocks[l] = prepare_block_vectors(*m.gpu, m.blocks[l]);
        }
        // The head follows the blocks onto the GPU (llama.cpp leaves it on the CPU, a known trap).
        m.gpu_head = prepare_head(*m.gpu, *m.output, *m.output_norm);
        m.gpu->synchronize();
    }
    if (!params.use_mmap) {
        // CPU blocks (and a CPU head) read their matrices from a huge-page copy instead of the mapping.
        std::vector<const GGUFTensor*> host;
        for (int32_t l = 0; l < hp.n_layer; ++l) {
            const BlockTensors& b = m.blocks[l];
            if (!m.on_gpu[l]) host.insert(host.end(), {b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down});
        }
        if (!m.any_gpu()) host.push_back(m.output);
        m.host_weights = std::make_unique<HostWeights>(host);
        for (BlockTensors& b : m.blocks)
            for (const GGUFTensor** t : {&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down})
                *t = m.host_weights->find(*t);
        m.output = m.host_weights->find(m.output);
        if (params.verbose)
            std::fprintf(stderr, "ember: %s: %.1f MiB of CPU weights copied to host memory (%s)\n", path.c_str(),
                         m.host_weights->bytes() / 1048576.0,
                         m.host_weights->huge_pages() ? "transparent huge pages" : "no huge pages");
    }
    if (params.verbose)
        std::fprintf(stderr, "ember: %s: arch %s, %d blocks (%d on GPU), n_embd %d, n_head %d/%d, vocab %d\n",
                     path.c_str(), hp.arch.c_str(), hp.n_layer, n_gpu, hp.n_embd, hp.n_head, hp.n_head_kv,
                     hp.n_vocab);
    return model;
}

Model::~Model() = default;
const HParams& Model::hparams() const { return impl_->hp; }
const Tokenizer& Model::tokenizer() const { return *impl_->tokenizer; }
const GGUFFile& Model::file() const { return *impl_->file; }
const ModelParams& Model::params() const { return impl_->params; }

}  // namespace ember
