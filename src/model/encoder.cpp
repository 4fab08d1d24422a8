// Encoder: packs whole sequences into forwards (bidirectional attention within each, no KV
// cache), runs the architecture's blocks on the devices the placement plan gives them, pools each
// sequence's rows on the host and applies the model's head on the CPU: the rank classifier (CLS
// row -> cls dense + tanh -> cls.output, llama.cpp's) or EmbeddingGemma's dense layers.
#include "ember/encoder.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "backend/registry.h"
#include "ember/quant.h"
#include "ember/status.h"
#include "model/arch/encoder_arch.h"
#include "model/model_impl.h"

namespace ember {

namespace {

// Activation buffers of one backend, each [n_batch][width] floats.
struct EncoderScratch {
    float *x = nullptr, *out_a = nullptr, *out_b = nullptr;
    BlockBuffers buf{};
};

const GGUFTensor* optional_tensor(const GGUFFile& f, const std::string& name, std::vector<int64_t> ne) {
    const GGUFTensor* t = f.find_tensor(name);
    if (t && t->ne != ne) {
        std::string want, got;
        for (auto d : ne) want += (want.empty() ? "" : ", ") + std::to_string(d);
        for (auto d : t->ne) got += (got.empty() ? "" : ", ") + std::to_string(d);
        fail(f.path(), ": tensor '", name, "' has shape [", got, "], expected [", want, "]");
    }
    return t;
}

// A 2-D tensor [n_in, any] (ne order) that exists, its second dimension unknown in advance.
const GGUFTensor* optional_matrix(const GGUFFile& f, const std::string& name, int64_t n_in) {
    const GGUFTensor* t = f.find_tensor(name);
    if (t && (t->ne.size() != 2 || t->ne[0] != n_in))
        fail(f.path(), ": tensor '", name, "' must be a matrix of rows of ", n_in, " values");
    return t;
}

}  // namespace

int32_t classifier_outputs(const Model& model) {
    const GGUFTensor* t = model.file().find_tensor("cls.output.weight");
    return t && t->ne.size() == 2 ? (int32_t)t->ne[1] : 0;
}

struct EncoderImpl {
    std::shared_ptr<Model> model;
    EncoderParams params;
    const EncoderArch* arch = nullptr;
    std::unique_ptr<Backend> cpu;
    std::vector<BlockWeights> blocks;
    std::map<Backend*, EncoderScratch> scratch;
    std::vector<std::pair<Backend*, void*>> owned;
    KVLayer no_kv;   // the blocks' KV argument, which encoders never read
    Pooling pooling = Pooling::mean;
    const GGUFTensor *types = nullptr, *positions = nullptr;
    const float *in_norm = nullptr, *in_norm_b = nullptr, *out_norm = nullptr;
    // The head, on the CPU.
    Weight cls, cls_out, dense_2, dense_3;
    const float *cls_b = nullptr, *cls_out_b = nullptr, *dense_2_b = nullptr;
    bool has_cls = false, has_cls_out = false, has_dense_2 = false, has_dense_3 = false;
    int32_t n_out = 0;
    std::vector<float> embd, rows;

    ~EncoderImpl() {
        for (auto& [be, p] : owned) be->free(p);
    }
    float* alloc(Backend& be, int64_t n) {
        void* p = be.alloc((size_t)std::max<int64_t>(n, 1) * sizeof(float));
        owned.emplace_back(&be, p);
        return static_cast<float*>(p);
    }
    EncoderScratch& scratch_for(Backend& be) {
        auto it = scratch.find(&be);
        if (it != scratch.end()) return it->second;
        const HParams& hp = model->hparams();
        const int64_t B = params.n_batch, E = hp.n_embd;
        const int64_t QW = (int64_t)hp.n_head * hp.head_dim, KW = (int64_t)hp.n_head_kv * hp.head_dim;
        EncoderScratch s;
        s.x = alloc(be, B * E), s.out_a = alloc(be, B * E), s.out_b = alloc(be, B * E);
        s.buf.xn = alloc(be, B * E);
        s.buf.q = alloc(be, B * QW), s.buf.k = alloc(be, B * KW), s.buf.v = alloc(be, B * KW);
        s.buf.att = alloc(be, B * QW);
        s.buf.gate = alloc(be, B * hp.n_ff), s.buf.up = alloc(be, B * hp.n_ff);
        if (hp.n_expert > 0)
            s.buf.moe = alloc(be, moe_scratch_floats(B, E, hp.n_ff_exp, hp.n_expert, hp.n_expert_used));
        return scratch.emplace(&be, s).first->second;
    }
    void read_head(const GGUFFile& f);
    void forward(const std::vector<const std::vector<int32_t>*>& seqs,
                 const std::vector<const std::vector<int32_t>*>& types_of, std::vector<float>& out);
    void head(std::vector<float>& pooled, int32_t n_rows, std::vector<float>& out);
};

void EncoderImpl::read_head(const GGUFFile& f) {
    const int64_t E = model->hparams().n_embd;
    const GGUFTensor* c = optional_tensor(f, "cls.weight", {E, E});
    const GGUFTensor* co = optional_matrix(f, "cls.output.weight", E);
    if (c) {
        has_cls = true;
        cls = cpu->prepare_weight(*c);
        if (const GGUFTensor* b = optional_tensor(f, "cls.bias", {E})) cls_b = cpu->prepare_vector(*b);
    }
    if (co) {
        has_cls_out = true;
        cls_out = cpu->prepare_weight(*co);
        if (const GGUFTensor* b = optional_tensor(f, "cls.output.bias", {co->ne[1]}))
            cls_out_b = cpu->prepare_vector(*b);
    }
    const GGUFTensor* d2 = optional_matrix(f, "dense_2.weight", E);
    if (d2) {
        has_dense_2 = true;
        dense_2 = cpu->prepare_weight(*d2);
        if (const GGUFTensor* b = optional_tensor(f, "dense_2.bias", {d2->ne[1]})) dense_2_b = cpu->prepare_vector(*b);
        const GGUFTensor* d3 = optional_matrix(f, "dense_3.weight", d2->ne[1]);
        if (d3) {
            if (d3->ne[1] != E) fail(f.path(), ": tensor 'dense_3.weight' must give ", E, " outputs, has ", d3->ne[1]);
            has_dense_3 = true;
            dense_3 = cpu->prepare_weight(*d3);
        } else if (d2->ne[1] != E) {
            fail(f.path(), ": dense_2.weight gives ", d2->ne[1],
                 " values a row and no dense_3.weight maps them back to ", E);
        }
    }
}

Encoder::Encoder(std::shared_ptr<Model> model, const EncoderParams& params) {
    if (params.n_batch <= 0) fail("n_batch must be positive, got ", params.n_batch);
    if (params.n_threads < 0) fail("n_threads must be >= 0, got ", params.n_threads);
    ModelImpl& m = model->impl();
    const auto* arch = dynamic_cast<const EncoderArch*>(m.arch);
    if (!arch)
        fail(m.file->path(), ": ", m.hp.arch,
             " is not an encoder (bert, nomic-bert, nomic-bert-moe, gemma-embedding): its ",
             "embeddings come from a Context with embeddings=true");
    impl_ = std::make_unique<EncoderImpl>();
    EncoderImpl& e = *impl_;
    e.model = std::move(model);
    e.params = params;
    e.arch = arch;
    const HParams& hp = m.hp;
    const GGUFFile& f = *m.file;
    const int64_t E = hp.n_embd;
    BackendOptions opts;
    opts.n_threads = params.n_threads > 0 ? params.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    e.cpu = make_backend("cpu", opts);
    e.blocks.resize(hp.n_layer);
    for (int32_t l = 0; l < hp.n_layer; ++l)
        e.blocks[l] = m.plan.block[l] == Device::gpu ? m.gpu_blocks[l] : prepare_block(*e.cpu, m.blocks[l]);

    const GGUFTensor* tt = f.find_tensor("token_types.weight");
    if (tt && (tt->ne.size() != 2 || tt->ne[0] != E))
        fail(f.path(), ": tensor 'token_types.weight' must be [", E, ", n_types]");
    e.types = tt;
    if (arch->absolute_positions()) {
        e.positions = &f.tensor("position_embd.weight");
        if (e.positions->ne.size() != 2 || e.positions->ne[0] != E)
            fail(f.path(), ": tensor 'position_embd.weight' must be [", E, ", n_positions]");
    }
    Backend& first = *e.blocks.front().backend;
    Backend& last = *e.blocks.back().backend;
    if (arch->input_layernorm()) {
        e.in_norm = first.prepare_vector(f.tensor("token_embd_norm.weight"));
        if (const GGUFTensor* b = optional_tensor(f, "token_embd_norm.bias", {E}))
            e.in_norm_b = first.prepare_vector(*b);
    }
    if (arch->output_rmsnorm()) {
        if (!m.output_norm) fail(f.path(), ": ", hp.arch, " needs tensor 'output_norm.weight'");
        e.out_norm = last.prepare_vector(*m.output_norm);
    }
    e.read_head(f);

    Pooling p = params.pooling;
    if (p == Pooling::unspecified) {
        const GGUFValue* key = f.find(hp.arch + ".pooling_type");
        p = key ? (Pooling)(int32_t)f.get_uint(hp.arch + ".pooling_type") : Pooling::mean;
    }
    if ((int32_t)p < 0 || (int32_t)p > 4) fail("pooling ", (int32_t)p, " is not one of 0 none .. 4 rank");
    if (p == Pooling::rank && !e.has_cls_out && !e.has_cls)
        fail(f.path(), ": rank pooling needs a classifier head (tensors cls.weight / cls.output.weight); this model ",
             "has none");
    e.pooling = p;
    e.n_out = (int32_t)E;
    if (p == Pooling::rank) e.n_out = e.has_cls_out ? (int32_t)e.cls_out.n_out : (int32_t)E;
    else if (e.has_dense_2) e.n_out = (int32_t)(e.has_dense_3 ? e.dense_3.n_out : e.dense_2.n_out);
    e.embd.resize((size_t)params.n_batch * E);
}

Encoder::~Encoder() = default;
Pooling Encoder::pooling() const { return impl_->pooling; }
int32_t Encoder::n_out() const { return impl_->n_out; }
int32_t Encoder::n_batch() const { return impl_->params.n_batch; }
const Model& Encoder::model() const { return *impl_->model; }

void EncoderImpl::forward(const std::vector<const std::vector<int32_t>*>& seqs,
                          const std::vector<const std::vector<int32_t>*>& types_of, std::vector<float>& out) {
    ModelImpl& m = model->impl();
    const HParams& hp = m.hp;
    const int64_t E = hp.n_embd;
    BatchInfo batch;
    batch.n_seq = (int32_t)seqs.size();
    for (int32_t s = 0; s < batch.n_seq; ++s)
        for (size_t i = 0; i < seqs[s]->size(); ++i) {
            batch.pos.push_back((int32_t)i);
            batch.seq.push_back(s);
        }
    const int32_t n = (int32_t)batch.pos.size();
    batch.n_tok = n;

    // The input rows on the host: token (scaled), plus token type and absolute position rows.
    const TypeTraits& et = type_traits(m.tok_embd->type);
    const size_t erow = row_bytes(m.tok_embd->type, E);
    const float scale = arch->embd_scale(hp);
    std::vector<float> extra(E);
    for (int32_t s = 0, t = 0; s < batch.n_seq; ++s)
        for (size_t i = 0; i < seqs[s]->size(); ++i, ++t) {
            float* row = &embd[(size_t)t * E];
            et.dequantize_row(m.tok_embd->data + (size_t)(*seqs[s])[i] * erow, row, E);
            if (scale != 1.0f)
                for (int64_t j = 0; j < E; ++j) row[j] *= scale;
            if (types) {
                const int32_t ty = types_of[s] ? (*types_of[s])[i] : 0;
                type_traits(types->type)
                    .dequantize_row(types->data + (size_t)ty * row_bytes(types->type, E), extra.data(), E);
                for (int64_t j = 0; j < E; ++j) row[j] += extra[j];
            }
            if (positions) {
                type_traits(positions->type)
                    .dequantize_row(positions->data + i * row_bytes(positions->type, E), extra.data(), E);
                for (int64_t j = 0; j < E; ++j) row[j] += extra[j];
            }
        }

    Backend* cur = nullptr;
    EncoderScratch* s = nullptr;
    const float* pending = nullptr;
    std::vector<Backend*> seen;
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        Backend& be = *blocks[l].backend;
        if (cur != &be) {
            EncoderScratch& next = scratch_for(be);
            if (std::find(seen.begin(), seen.end(), &be) == seen.end()) {
                be.set_batch(batch);
                seen.push_back(&be);
            }
            if (!cur) {
                be.copy_from_host(next.x, embd.data(), (size_t)n * E * sizeof(float));
                if (in_norm) be.layernorm(next.x, in_norm, in_norm_b, n, (int32_t)E, hp.rms_eps, next.x);
            } else {
                if (pending) cur->add(s->x, pending, (int64_t)n * E);
                pending = nullptr;
                std::vector<float> tmp((size_t)n * E);
                cur->copy_to_host(tmp.data(), s->x, tmp.size() * sizeof(float));
                be.copy_from_host(next.x, tmp.data(), tmp.size() * sizeof(float));
            }
            cur = &be;
            s = &next;
        }
        const BlockRun run{be, blocks[l], m.layers[l], hp, no_kv, s->buf, n, s->x, pending, s->out_a, s->out_b};
        pending = arch->forward_block(run);
    }
    if (pending) cur->add(s->x, pending, (int64_t)n * E);
    if (out_norm) cur->rmsnorm(s->x, out_norm, n, (int32_t)E, hp.rms_eps, s->x);
    rows.resize((size_t)n * E);
    cur->copy_to_host(rows.data(), s->x, rows.size() * sizeof(float));

    // Pooling, in double over each sequence's rows.
    std::vector<float> pooled;
    for (int32_t q = 0, t0 = 0; q < batch.n_seq; t0 += (int32_t)seqs[q]->size(), ++q) {
        const int32_t len = (int32_t)seqs[q]->size();
        const float* r0 = &rows[(size_t)t0 * E];
        switch (pooling) {
            case Pooling::none: out.insert(out.end(), r0, r0 + (size_t)len * E); break;
            case Pooling::mean: {
                std::vector<double> acc(E, 0.0);
                for (int32_t i = 0; i < len; ++i)
                    for (int64_t j = 0; j < E; ++j) acc[j] += r0[i * E + j];
                for (int64_t j = 0; j < E; ++j) pooled.push_back((float)(acc[j] / len));
                break;
            }
            case Pooling::last: pooled.insert(pooled.end(), r0 + (size_t)(len - 1) * E, r0 + (size_t)len * E); break;
            default:   // cls and rank: the first token's row
                pooled.insert(pooled.end(), r0, r0 + E);
        }
    }
    if (pooling != Pooling::none) head(pooled, batch.n_seq, out);
}

void EncoderImpl::head(std::vector<float>& pooled, int32_t n_rows, std::vector<float>& out) {
    BatchInfo b;
    b.n_tok = n_rows;
    b.n_seq = 1;
    b.pos.resize(n_rows);
    for (int32_t i = 0; i < n_rows; ++i) b.pos[i] = i;
    b.seq.assign(n_rows, 0);
    cpu->set_batch(b);
    auto apply = [&](const Weight& w, const float* bias, std::vector<float>& x) {
        std::vector<float> y((size_t)n_rows * w.n_out);
        cpu->matmul(w, x.data(), n_rows, y.data());
        if (bias) cpu->add_bias(y.data(), bias, n_rows, (int32_t)w.n_out);
        x.swap(y);
    };
    if (pooling == Pooling::rank) {
        if (has_cls) {
            apply(cls, cls_b, pooled);
            cpu->unary(UnaryOp::Tanh, pooled.data(), (int64_t)pooled.size());
        }
        if (has_cls_out) apply(cls_out, cls_out_b, pooled);
    } else if (has_dense_2) {
        apply(dense_2, dense_2_b, pooled);
        if (has_dense_3) apply(dense_3, nullptr, pooled);
    }
    out.insert(out.end(), pooled.begin(), pooled.end());
}

std::vector<float> Encoder::encode(const std::vector<std::vector<int32_t>>& seqs,
                                   const std::vector<std::vector<int32_t>>& types) {
    EncoderImpl& e = *impl_;
    const HParams& hp = e.model->hparams();
    if (!types.empty() && types.size() != seqs.size())
        fail("encode: ", types.size(), " token type lists for ", seqs.size(), " sequences");
    const int64_t n_types = e.types ? e.types->ne[1] : 1;
    const int64_t n_pos = e.positions ? e.positions->ne[1] : INT64_MAX;
    for (size_t s = 0; s < seqs.size(); ++s) {
        const std::vector<int32_t>& q = seqs[s];
        if (q.empty()) fail("encode: sequence ", s, " is empty");
        if ((int64_t)q.size() > e.params.n_batch)
            fail("encode: sequence ", s, " has ", q.size(), " tokens, more than n_batch ", e.params.n_batch,
                 " (a sequence runs in one forward)");
        if ((int64_t)q.size() > n_pos)
            fail("encode: sequence ", s, " has ", q.size(), " tokens, more than the model's ", n_pos, " positions");
        for (size_t i = 0; i < q.size(); ++i)
            if (q[i] < 0 || q[i] >= hp.n_vocab)
                fail("encode: token id ", q[i], " at index ", i, " of sequence ", s, " is out of range [0, ",
                     hp.n_vocab, ")");
        if (types.empty()) continue;
        if (types[s].size() != q.size())
            fail("encode: sequence ", s, " has ", q.size(), " tokens but ", types[s].size(), " token types");
        for (int32_t t : types[s])
            if (t < 0 || t >= n_types)
                fail("encode: token type ", t, " in sequence ", s, " is out of range [0, ", n_types, ")");
    }
    std::vector<float> out;
    std::vector<const std::vector<int32_t>*> batch, batch_types;
    int64_t used = 0;
    auto flush = [&] {
        if (batch.empty()) return;
        e.forward(batch, batch_types, out);
        batch.clear(), batch_types.clear();
        used = 0;
    };
    for (size_t s = 0; s < seqs.size(); ++s) {
        if (used + (int64_t)seqs[s].size() > e.params.n_batch) flush();
        batch.push_back(&seqs[s]);
        batch_types.push_back(types.empty() ? nullptr : &types[s]);
        used += (int64_t)seqs[s].size();
    }
    flush();
    return out;
}

}  // namespace ember
