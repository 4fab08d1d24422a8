// ImatrixCollector and the recording backend (imatrix_collector.h).
#include "model/imatrix_collector.h"

#include <cstddef>

#include "ember/gguf.h"
#include "ember/status.h"

namespace ember {

void ImatrixCollector::add(const Weight& w, const float* x, int32_t n_tok, int32_t expert, int32_t n_mat) {
    if (!w.src) return;
    const std::string& name = w.src->name;
    if (name.rfind("blk.", 0) != 0 && !(process_output_ && name == "output.weight")) return;
    std::lock_guard<std::mutex> lock(mutex_);
    ImatrixEntry& e = entries_[name];
    if (e.sums.empty()) {
        e.sums.assign(size_t(n_mat) * w.n_in, 0.0);
        e.counts.assign(n_mat, 0);
    }
    if (e.counts.size() != size_t(n_mat) || expert < 0 || expert >= n_mat)
        fail("ember-imatrix: '", name, "' seen as matrix ", expert, " of ", n_mat, " after as one of ",
             e.counts.size());
    double* sums = e.sums.data() + size_t(expert) * w.n_in;
    for (int32_t t = 0; t < n_tok; ++t) {
        const float* row = x + (size_t)t * w.n_in;
        for (int64_t i = 0; i < w.n_in; ++i) sums[i] += (double)row[i] * row[i];
    }
    e.counts[expert] += n_tok;
}

std::map<std::string, ImatrixEntry> ImatrixCollector::entries() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_;
}

namespace {

std::mutex g_mutex;
std::shared_ptr<ImatrixCollector> g_collector;

class RecordingBackend final : public Backend {
public:
    RecordingBackend(std::unique_ptr<Backend> inner, std::shared_ptr<ImatrixCollector> c)
        : in_(std::move(inner)), c_(std::move(c)) {}

    const char* name() const override { return in_->name(); }
    bool is_host() const override { return in_->is_host(); }
    void* alloc(size_t bytes) override { return in_->alloc(bytes); }
    void free(void* p) override { in_->free(p); }
    void copy_from_host(void* dst, const void* src, size_t bytes) override { in_->copy_from_host(dst, src, bytes); }
    void copy_to_host(void* dst, const void* src, size_t bytes) override { in_->copy_to_host(dst, src, bytes); }
    void synchronize() override { in_->synchronize(); }
    void copy_to_host_async(void* dst, const void* src, size_t bytes) override {
        in_->copy_to_host_async(dst, src, bytes);
    }
    void copy(void* dst, const void* src, size_t bytes) override { in_->copy(dst, src, bytes); }
    void* alloc_host(size_t bytes) override { return in_->alloc_host(bytes); }
    void free_host(void* p) override { in_->free_host(p); }
    size_t free_memory() override { return in_->free_memory(); }
    // A stacked expert weight is noted, to tell which expert a matrix of it is (record).
    Weight prepare_weight(const GGUFTensor& t) override {
        const Weight w = in_->prepare_weight(t);
        if (w.n_expert > 1) {
            std::lock_guard<std::mutex> lock(mutex_);
            stacked_[&t] = w;
        }
        return w;
    }
    const float* prepare_vector(const GGUFTensor& t) override { return in_->prepare_vector(t); }
    void set_batch(const BatchInfo& batch) override { in_->set_batch(batch); }

    void matmul(const Weight& w, const float* x, int32_t n_tok, float* y) override {
        record(w, x, n_tok);
        in_->matmul(w, x, n_tok, y);
    }

    void rmsnorm(const float* x, const float* gamma, int32_t n_tok, int32_t dim, float eps, float* y) override {
        in_->rmsnorm(x, gamma, n_tok, dim, eps, y);
    }
    void head_rmsnorm(float* x, const float* gamma, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                      float eps) override {
        in_->head_rmsnorm(x, gamma, n_tok, n_heads, head_dim, eps);
    }
    void rmsnorm_grouped(const float* x, const float* gamma, int32_t n_rows, int64_t width, int32_t n_groups, float eps,
                         float* y) override {
        in_->rmsnorm_grouped(x, gamma, n_rows, width, n_groups, eps, y);
    }
    void rope(float* x, int32_t n_tok, int32_t n_heads, const RopeParams& rope) override {
        in_->rope(x, n_tok, n_heads, rope);
    }
    void attn_temperature(float* q, int32_t n_tok, int64_t width, const RopeParams& rope) override {
        in_->attn_temperature(q, n_tok, width, rope);
    }
    void kv_store(KVLayer& kv, const float* k, const float* v, int32_t n_tok) override {
        in_->kv_store(kv, k, v, n_tok);
    }
    void attention(const KVLayer& kv, const float* q, int32_t n_tok, const AttentionShape& shape, float* out) override {
        in_->attention(kv, q, n_tok, shape, out);
    }
    void gated_act(Activation act, const float* gate, const float* up, int64_t n, float* out) override {
        in_->gated_act(act, gate, up, n, out);
    }
    void add(float* x, const float* y, int64_t n) override { in_->add(x, y, n); }
    void add_bias(float* x, const float* bias, int32_t n_tok, int32_t dim) override {
        in_->add_bias(x, bias, n_tok, dim);
    }
    void argmax_rows(const float* x, int32_t n_rows, int64_t width, int32_t* ids) override {
        in_->argmax_rows(x, n_rows, width, ids);
    }
    void moe_route(const MoeWeights& w, const float* logits, int32_t n_tok, int32_t* ids, float* weights) override {
        in_->moe_route(w, logits, n_tok, ids, weights);
    }
    void gather_rows(const float* x, const int32_t* rows, int32_t n_rows, int64_t dim, float* y) override {
        in_->gather_rows(x, rows, n_rows, dim, y);
    }
    void scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* scale, int32_t n_rows,
                          int64_t dim) override {
        in_->scatter_add_rows(out, y, rows, scale, n_rows, dim);
    }
    void sigmoid(float* x, int64_t n) override { in_->sigmoid(x, n); }
    void mul(float* x, const float* y, int64_t n) override { in_->mul(x, y, n); }
    void softplus_gate(float* x, const float* bias, const float* scale, int32_t n_tok, int32_t dim) override {
        in_->softplus_gate(x, bias, scale, n_tok, dim);
    }
    void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t width,
                   int64_t n_rows) override {
        in_->copy_rows(dst, dst_stride, src, src_stride, width, n_rows);
    }
    void scale_softcap(float* x, int64_t n, float scale, float cap) override { in_->scale_softcap(x, n, scale, cap); }
    void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                          int32_t n_tok, const DeltaRuleShape& shape, float* state, float* out) override {
        in_->gated_delta_rule(q, k, v, g, beta, n_tok, shape, state, out);
    }
    void short_conv(const float* x, const float* w, const float* bias, int32_t n_tok, int32_t channels, int32_t kernel,
                    bool silu, float* state, float* y) override {
        in_->short_conv(x, w, bias, n_tok, channels, kernel, silu, state, y);
    }
    void ssm_scan(const float* xbc, const float* dt, const float* A, const float* dt_bias, const float* D,
                  int32_t n_tok, const SsmShape& shape, float* state, float* y) override {
        in_->ssm_scan(xbc, dt, A, dt_bias, D, n_tok, shape, state, y);
    }
    void layernorm(const float* x, const float* gamma, const float* beta, int32_t n_tok, int32_t dim, float eps,
                   float* y) override {
        in_->layernorm(x, gamma, beta, n_tok, dim, eps, y);
    }
    void unary(UnaryOp f, float* x, int64_t n) override { in_->unary(f, x, n); }
    void encoder_attention(const float* q, const float* k, const float* v, int32_t n_tok, const AttentionShape& shape,
                           float* out) override {
        in_->encoder_attention(q, k, v, n_tok, shape, out);
    }
    HostParallelFor host_parallel_for() override { return in_->host_parallel_for(); }

private:
    // A matrix of a 3-D tensor is one of its experts: which one, from its offset in the stacked weight.
    void record(const Weight& w, const float* x, int32_t n_tok) {
        if (!w.src || w.src->ne.size() < 3 || w.src->ne[2] == 1) return c_->add(w, x, n_tok);
        Weight s;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            const auto it = stacked_.find(w.src);
            if (it == stacked_.end() || it->second.expert_stride == 0)
                fail("ember-imatrix: '", w.src->name, "' is a stacked expert tensor not prepared on this backend");
            s = it->second;
        }
        const auto at = static_cast<const unsigned char*>(w.data) - static_cast<const unsigned char*>(s.data);
        c_->add(w, x, n_tok, int32_t(at / std::ptrdiff_t(s.expert_stride)), s.n_expert);
    }

    std::unique_ptr<Backend> in_;
    std::shared_ptr<ImatrixCollector> c_;
    std::mutex mutex_;
    std::map<const GGUFTensor*, Weight> stacked_;
};

}  // namespace

void set_imatrix_collector(std::shared_ptr<ImatrixCollector> c) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_collector = std::move(c);
}

std::shared_ptr<ImatrixCollector> imatrix_collector() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_collector;
}

std::unique_ptr<Backend> record_imatrix(std::unique_ptr<Backend> inner, std::shared_ptr<ImatrixCollector> c) {
    return std::make_unique<RecordingBackend>(std::move(inner), std::move(c));
}

}  // namespace ember
