// Every op of the backend contract (src/backend/backend.h) on numpy arrays (_ember_test.Backend),
// so each backend in the registry can be checked against a reference on fresh random data
// (tests/test_backend_ops.py). Each call copies inputs in and results out; fused ops can also run
// as the contract's default composition of the backend's own primitives (composed=True).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_layout.h"
#include "backend/registry.h"
#include "ember/quant.h"
#include "ember/status.h"
#include "kv_type_arg.h"

namespace nb = nanobind;
using namespace ember;

namespace {

using F32In = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using F32Out = nb::ndarray<nb::numpy, float>;
using U8In = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;

F32Out make_out(std::vector<float>&& v, std::initializer_list<size_t> shape) {
    auto* heap = new std::vector<float>(std::move(v));
    nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    return F32Out(heap->data(), shape, owner);
}

// Device buffer that frees itself.
struct Buf {
    Backend& be;
    void* p;
    Buf(Backend& b, size_t bytes) : be(b), p(b.alloc(std::max<size_t>(bytes, 4))) {}
    Buf(Backend& b, const void* src, size_t bytes) : Buf(b, bytes) { b.copy_from_host(p, src, bytes); }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    ~Buf() { be.free(p); }
    float* f() { return static_cast<float*>(p); }
};

std::vector<float> download(Backend& be, const Buf& b, size_t n) {
    std::vector<float> out(n);
    be.synchronize();
    be.copy_to_host(out.data(), b.p, n * sizeof(float));
    return out;
}

// An optional float vector of n values uploaded to the backend; null when absent.
std::unique_ptr<Buf> optional_vector(Backend& be, const std::optional<F32In>& v, size_t n, const char* what) {
    if (!v) return nullptr;
    if (v->ndim() != 1 || v->size() != n) fail(what, " must be [", n, "] float32, got ", v->size(), " values");
    return std::make_unique<Buf>(be, v->data(), n * sizeof(float));
}

const float* ptr(const std::unique_ptr<Buf>& b) { return b ? b->f() : nullptr; }

BatchInfo one_sequence_batch(const std::vector<int32_t>& pos, const std::vector<int32_t>& table) {
    BatchInfo b;
    b.n_tok = (int32_t)pos.size();
    b.pos = pos;
    b.seq.assign(pos.size(), 0);
    b.n_seq = 1;
    b.max_blocks = (int32_t)table.size();
    b.block_table = table;
    return b;
}

void check_positions(const std::vector<int32_t>& pos, const char* fn) {
    if (pos.empty()) fail(fn, ": pos must not be empty");
    for (int32_t p : pos)
        if (p < 0) fail(fn, ": position ", p, " is negative");
}

Activation activation_arg(const std::string& name) {
    if (name == "silu") return Activation::SiLU;
    if (name == "gelu_tanh") return Activation::GeLUTanh;
    if (name == "swiglu_clamped") return Activation::SwiGLUClamped;
    fail("act must be 'silu', 'gelu_tanh' or 'swiglu_clamped', got '", name, "'");
}

MoeGating gating_arg(const std::string& name) {
    if (name == "softmax") return MoeGating::softmax;
    if (name == "topk_softmax") return MoeGating::topk_softmax;
    if (name == "sigmoid") return MoeGating::sigmoid;
    fail("moe: gating must be 'softmax', 'topk_softmax' or 'sigmoid', got '", name, "'");
}

// A KV layer holding n_seq sequences of len positions, in blocks taken from a shuffled list with
// spares (so block ids are not simply 0..n-1). Every byte starts as 0xff (NaN in each KV type): a
// kernel that lets a row it was not given into its result shows as NaN.
struct PagedKV {
    KVLayer kv;
    int32_t n_seq = 1, n_used = 0;
    std::vector<int32_t> table;   // [n_seq][n_used] physical block ids
    std::unique_ptr<Buf> k, v;
    PagedKV(Backend& be, int32_t len, int32_t block_size, int32_t n_head_kv, int32_t head_dim, KVTypes types,
            uint64_t seed, int32_t n_seqs = 1) {
        if (block_size <= 0) fail("block_size must be positive, got ", block_size);
        if (n_seqs <= 0) fail("n_seq must be positive, got ", n_seqs);
        if (len <= 0) fail("the KV layer needs at least one position, got ", len);
        check_kv_type(types.k, head_dim, "type_k");
        check_kv_type(types.v, head_dim, "type_v");
        n_seq = n_seqs;
        n_used = (len + block_size - 1) / block_size;
        kv.n_blocks = n_used * n_seq * 2;
        std::vector<int32_t> ids(kv.n_blocks);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
        table.assign(ids.begin(), ids.begin() + (size_t)n_used * n_seq);
        kv.block_size = block_size;
        kv.n_head_kv = n_head_kv;
        kv.head_dim = head_dim;
        kv.k_type = types.k;
        kv.v_type = types.v;
        const auto cache = [&](GGMLType t) {
            const std::vector<uint8_t> nan_bytes(bytes(t), 0xff);
            return std::make_unique<Buf>(be, nan_bytes.data(), nan_bytes.size());
        };
        k = cache(types.k);
        v = cache(types.v);
        kv.k = k->p;
        kv.v = v->p;
    }
    size_t width() const { return (size_t)kv.n_head_kv * kv.head_dim; }
    size_t block_bytes(GGMLType t) const { return kv_block_bytes(t, kv.block_size, (int64_t)width()); }
    size_t bytes(GGMLType t) const { return (size_t)kv.n_blocks * block_bytes(t); }
    // The rows of positions pos of sequence seq in the K (v_cache false) or V cache, as float
    // [len(pos)][width], decoded from the bytes by kv_layout.h's layout of the cache's type.
    std::vector<float> rows(Backend& be, bool v_cache, int32_t seq, const std::vector<int32_t>& pos) const {
        const GGMLType t = v_cache ? kv.v_type : kv.k_type;
        std::vector<uint8_t> all(bytes(t));
        be.synchronize();
        be.copy_to_host(all.data(), (v_cache ? v : k)->p, all.size());
        const size_t w = width(), bb = block_bytes(t);
        const int32_t bs = kv.block_size, hd = kv.head_dim;
        std::vector<float> out;
        for (int32_t p : pos) {
            const uint8_t* block = all.data() + (size_t)table[(size_t)seq * n_used + p / bs] * bb;
            const int32_t slot = p % bs;
            if (kv_type_is_blocked(t) && t != GGMLType::Q8_0) {   // rows of ggml blocks
                const size_t rb = row_bytes(t, (int64_t)w), at = out.size();
                out.resize(at + w);
                type_traits(t).dequantize_row(block + (size_t)slot * rb, out.data() + at, (int64_t)w);
                continue;
            }
            for (size_t i = 0; i < w; ++i) {
                if (t == GGMLType::F32) {
                    float f;
                    std::memcpy(&f, block + ((size_t)slot * w + i) * 4, 4);
                    out.push_back(f);
                } else if (t == GGMLType::F16) {
                    uint16_t h;
                    std::memcpy(&h, block + ((size_t)slot * w + i) * 2, 2);
                    out.push_back(fp16_to_fp32(h));
                } else if (t == GGMLType::BF16) {
                    uint16_t h;
                    std::memcpy(&h, block + ((size_t)slot * w + i) * 2, 2);
                    out.push_back(bf16_to_fp32(h));
                } else {
                    const int32_t head = (int32_t)(i / hd), d = (int32_t)(i % hd);
                    uint16_t scale;
                    std::memcpy(&scale, block + (size_t)bs * w + (kv_q8_scale(bs, hd, head, slot) + d / 32) * 2, 2);
                    const int8_t q = (int8_t)block[kv_q8_value(bs, hd, head, slot) + d];
                    out.push_back(fp16_to_fp32(scale) * q);
                }
            }
        }
        return out;
    }
    // A batch of tokens at (seq[t], pos[t]) over this layer's block table.
    BatchInfo batch(const std::vector<int32_t>& pos, const std::vector<int32_t>& seq) const {
        BatchInfo b;
        b.n_tok = (int32_t)pos.size();
        b.pos = pos;
        b.seq = seq.empty() ? std::vector<int32_t>(pos.size(), 0) : seq;
        b.n_seq = n_seq;
        b.max_blocks = n_used;
        b.block_table = table;
        return b;
    }
};

RopeParams rope_params(int32_t head_dim, float base, bool neox, float freq_scale, float ext_factor, float attn_factor,
                       float corr_lo, float corr_hi, const std::optional<F32In>& freq_factors, int32_t n_rot = 0,
                       float temp_scale = 0.0f, int32_t temp_length = 0) {
    if (head_dim <= 0 || head_dim % 2) fail("rope: head_dim must be positive and even, got ", head_dim);
    if (n_rot < 0 || n_rot % 2 || n_rot > head_dim)
        fail("rope: n_rot must be even and between 0 (the whole head) and head_dim ", head_dim, ", got ", n_rot);
    if (temp_scale != 0.0f && temp_length <= 0)
        fail("rope: an attention temperature needs a positive temp_length, got ", temp_length);
    RopeParams r{base, head_dim, neox, freq_scale, ext_factor, attn_factor, corr_lo, corr_hi, {}};
    r.n_rot = n_rot;
    r.temp_scale = temp_scale;
    r.temp_length = temp_length;
    const int32_t pairs = r.rotated() / 2;
    if (freq_factors) {
        if (freq_factors->ndim() != 1 || freq_factors->size() != (size_t)pairs)
            fail("rope: freq_factors must be [rotated dims / 2 = ", pairs, "] float32, got ", freq_factors->size(),
                 " values");
        r.freq_factors.assign(freq_factors->data(), freq_factors->data() + freq_factors->size());
    }
    return r;
}

struct PyBackend {
    std::unique_ptr<Backend> be;
    // switches: EMBER_* name -> value for this backend only (over the environment), so a test
    // can run an op under each kernel choice in one process.
    PyBackend(const std::string& kind, int n_threads, int device, const std::map<std::string, std::string>& switches) {
        BackendOptions opts;
        opts.n_threads = n_threads;
        opts.device = device;
        for (const auto& [name, value] : switches) opts.switches = opts.switches.with(name, value);
        be = make_backend(kind, opts);
    }

    // A weight of n_in-element rows in type type_id, as the backend keeps it.
    Weight weight(uint32_t type_id, const U8In& w, int64_t n_in, const char* what) {
        const TypeTraits* tr = find_type_traits(type_id);
        if (!tr) fail(what, ": unknown type id ", type_id);
        if (w.ndim() != 2 || w.shape(1) != row_bytes(tr->type, n_in))
            fail(what, " must be [n_out, ", row_bytes(tr->type, n_in), "] bytes for ", n_in, " ", tr->name,
                 " elements per row");
        GGUFTensor t{what, tr->type, {n_in, (int64_t)w.shape(0)}, 0, w.size(), w.data()};
        Weight out = be->prepare_weight(t);
        out.src = nullptr;   // (t is gone after this call; only streamed weights read src)
        return out;
    }

    static void check_rows(const F32In& x, size_t n_tok, int64_t width, const char* what) {
        if (x.ndim() != 2 || x.shape(0) != n_tok || (int64_t)x.shape(1) != width)
            fail(what, " must be [", n_tok, ", ", width, "] float32");
    }

    // n_seq: run under a batch of that many sequences (token t in sequence t % n_seq), as the
    // engine's steps do, so kernels that depend on the batch (the CPU's fast matmul) are chosen;
    // a one-sequence batch is set again afterwards.
    void multi_seq_batch(std::optional<int32_t> n_seq, bool batch_invariant, int32_t n_tok) {
        if (!n_seq) return;
        if (*n_seq < 1) fail("n_seq must be positive, got ", *n_seq);
        BatchInfo b = one_sequence_batch(std::vector<int32_t>(n_tok, 0), {0});
        b.n_seq = *n_seq;
        b.block_table.assign(*n_seq, 0);
        for (int32_t t = 0; t < n_tok; ++t) b.seq[t] = t % *n_seq;
        b.batch_invariant = batch_invariant;
        be->set_batch(b);
    }
    void end_multi_seq_batch(std::optional<int32_t> n_seq, int32_t n_tok) {
        if (n_seq) be->set_batch(one_sequence_batch(std::vector<int32_t>(n_tok, 0), {0}));
    }

    F32Out matmul(uint32_t type_id, U8In w, int64_t n_in, F32In x, std::optional<int32_t> n_seq, bool batch_invariant) {
        Weight wt = weight(type_id, w, n_in, "weight");
        if (x.ndim() != 2) fail("x must be [n_tok, ", n_in, "] float32");
        check_rows(x, x.shape(0), n_in, "x");
        const int32_t n_tok = (int32_t)x.shape(0);
        const int64_t n_out = wt.n_out;
        Buf xb(*be, x.data(), x.size() * sizeof(float)), yb(*be, (size_t)n_tok * n_out * sizeof(float));
        multi_seq_batch(n_seq, batch_invariant, n_tok);
        be->matmul(wt, xb.f(), n_tok, yb.f());
        end_multi_seq_batch(n_seq, n_tok);
        return make_out(download(*be, yb, (size_t)n_tok * n_out), {(size_t)n_tok, (size_t)n_out});
    }

    // Backend::matmul_many: weights i of type type_ids[i], all reading x; one output per weight.
    std::vector<F32Out> matmul_many(std::vector<uint32_t> type_ids, std::vector<U8In> ws, int64_t n_in, F32In x,
                                    std::optional<int32_t> n_seq, bool batch_invariant, bool composed) {
        if (type_ids.size() != ws.size() || ws.empty()) fail("matmul_many: one type id per weight, at least one");
        if (x.ndim() != 2) fail("x must be [n_tok, ", n_in, "] float32");
        check_rows(x, x.shape(0), n_in, "x");
        const int32_t n_tok = (int32_t)x.shape(0);
        std::vector<Weight> wts;
        std::vector<std::unique_ptr<Buf>> ybs;
        std::vector<const Weight*> wp;
        std::vector<float*> yp;
        for (size_t i = 0; i < ws.size(); ++i) wts.push_back(weight(type_ids[i], ws[i], n_in, "weight"));
        for (const Weight& wt : wts) {
            ybs.push_back(std::make_unique<Buf>(*be, (size_t)n_tok * wt.n_out * sizeof(float)));
            wp.push_back(&wt);
            yp.push_back(ybs.back()->f());
        }
        Buf xb(*be, x.data(), x.size() * sizeof(float));
        multi_seq_batch(n_seq, batch_invariant, n_tok);
        if (composed) be->Backend::matmul_many(wp.data(), yp.data(), (int)wp.size(), xb.f(), n_tok);
        else be->matmul_many(wp.data(), yp.data(), (int)wp.size(), xb.f(), n_tok);
        end_multi_seq_batch(n_seq, n_tok);
        std::vector<F32Out> out;
        for (size_t i = 0; i < wts.size(); ++i)
            out.push_back(
                make_out(download(*be, *ybs[i], (size_t)n_tok * wts[i].n_out), {(size_t)n_tok, (size_t)wts[i].n_out}));
        return out;
    }

    // The fused feed-forward op: x += residual; xn = rmsnorm(x) * norm; down(act(xn gate^T) * (xn up^T)).
    // gate and up [n_ff] rows of n_in, down [n_in] rows of n_ff. Returns (out, x after the residual add).
    std::vector<F32Out> ffn(uint32_t type_id, U8In gate, U8In up, U8In down, int64_t n_in, F32In x, F32In norm,
                            float eps, std::optional<F32In> residual, const std::string& act, bool composed) {
        Weight wg = weight(type_id, gate, n_in, "gate"), wu = weight(type_id, up, n_in, "up");
        const int64_t n_ff = wg.n_out;
        Weight wd = weight(type_id, down, n_ff, "down");
        if (wu.n_out != n_ff || wd.n_out != n_in) fail("ffn: gate and up need n_ff rows, down n_in rows");
        if (x.ndim() != 2) fail("x must be [n_tok, ", n_in, "] float32");
        const size_t n_tok = x.shape(0);
        check_rows(x, n_tok, n_in, "x");
        if (residual) check_rows(*residual, n_tok, n_in, "residual");
        std::unique_ptr<Buf> normb = optional_vector(*be, norm, (size_t)n_in, "norm");
        const FfnWeights fw{normb->f(), eps, &wg, &wu, &wd, activation_arg(act)};
        Buf xb(*be, x.data(), x.size() * 4), xn(*be, x.size() * 4), gb(*be, n_tok * n_ff * 4),
            ub(*be, n_tok * n_ff * 4), yb(*be, x.size() * 4);
        std::unique_ptr<Buf> rb = residual ? std::make_unique<Buf>(*be, residual->data(), residual->size() * 4)
                                           : nullptr;
        const BlockBuffers b{xn.f(), nullptr, nullptr, nullptr, nullptr, gb.f(), ub.f()};
        if (composed) be->Backend::ffn(fw, xb.f(), ptr(rb), (int32_t)n_tok, b, yb.f());
        else be->ffn(fw, xb.f(), ptr(rb), (int32_t)n_tok, b, yb.f());
        return {make_out(download(*be, yb, x.size()), {n_tok, (size_t)n_in}),
                make_out(download(*be, xb, x.size()), {n_tok, (size_t)n_in})};
    }

    // The mixture's experts (Backend::moe) on normed rows x [n_tok][n_embd]: gate and up stacked
    // [n_expert * n_ff] rows of n_embd, down [n_expert * n_embd] rows of n_ff, all of type type_id;
    // router [n_expert][n_embd] float32. n_seq / batch_invariant: the batch as for matmul. graph_steps
    // > 0: the op runs that many times as a step between step_begin and step_end (a GPU records the
    // second and replays it from the third), the output cleared before each; the last is returned.
    F32Out moe(uint32_t type_id, U8In gate, U8In up, U8In down, F32In router, F32In x, int32_t n_used,
               const std::string& gating, bool norm_topk, float weight_scale, const std::string& act,
               std::optional<F32In> router_bias, std::optional<F32In> gate_bias, std::optional<F32In> up_bias,
               std::optional<F32In> down_bias, std::optional<int32_t> n_seq, bool batch_invariant, bool composed,
               int32_t graph_steps, std::optional<F32In> selection_bias, std::optional<U8In> shared_gate,
               std::optional<U8In> shared_up, std::optional<U8In> shared_down, std::optional<F32In> shared_gate_inp,
               std::optional<F32In> norm, std::optional<F32In> residual, bool weight_input) {
        if (router.ndim() != 2) fail("moe: router must be [n_expert, n_embd] float32");
        if (graph_steps > 0 && !n_seq) fail("moe: graph_steps needs n_seq (the batch the steps are recorded for)");
        const int32_t n_exp = (int32_t)router.shape(0);
        const int64_t n_embd = (int64_t)router.shape(1);
        const TypeTraits* tr = find_type_traits(type_id);
        if (!tr) fail("moe: unknown type id ", type_id);
        if (n_exp < 1 || gate.ndim() != 2 || gate.shape(0) % n_exp)
            fail("moe: gate must stack n_expert = ", n_exp, " matrices");
        const int64_t n_ff = (int64_t)gate.shape(0) / n_exp;
        auto stacked = [&](const U8In& w, int64_t n_in, int64_t n_out, const char* what) {
            if (w.ndim() != 2 || (int64_t)w.shape(0) != n_out * n_exp || w.shape(1) != row_bytes(tr->type, n_in))
                fail("moe: ", what, " must be [", n_out * n_exp, ", ", row_bytes(tr->type, n_in), "] bytes");
            GGUFTensor t{what, tr->type, {n_in, n_out, n_exp}, 0, w.size(), w.data()};
            Weight out = be->prepare_weight(t);
            out.src = nullptr;
            return out;
        };
        Weight wg = stacked(gate, n_embd, n_ff, "gate"), wu = stacked(up, n_embd, n_ff, "up"),
               wd = stacked(down, n_ff, n_embd, "down");
        if (!!shared_gate != !!shared_up || !!shared_gate != !!shared_down || (shared_gate_inp && !shared_gate))
            fail(
                "moe: the shared expert needs shared_gate, shared_up and shared_down (and shared_gate_inp only with them)");
        const int64_t n_ff_s = shared_gate ? (int64_t)shared_gate->shape(0) : 0;
        Weight sg, su, sd, sgi;
        if (shared_gate) {
            sg = weight(type_id, *shared_gate, n_embd, "moe: shared_gate");
            su = weight(type_id, *shared_up, n_embd, "moe: shared_up");
            sd = weight(type_id, *shared_down, n_ff_s, "moe: shared_down");
            if (su.n_out != n_ff_s || sd.n_out != n_embd)
                fail("moe: shared_up must be [", n_ff_s, ", ...] and shared_down [", n_embd, ", ...]");
        }
        if (shared_gate_inp && (shared_gate_inp->ndim() != 1 || (int64_t)shared_gate_inp->size() != n_embd))
            fail("moe: shared_gate_inp must be [", n_embd, "] float32");
        if (shared_gate_inp) {
            GGUFTensor t{"shared_gate_inp",    GGMLType::F32,
                         {n_embd, 1},          0,
                         (uint64_t)n_embd * 4, reinterpret_cast<const uint8_t*>(shared_gate_inp->data())};
            sgi = be->prepare_weight(t);
            sgi.src = nullptr;
        }
        GGUFTensor rt{"router", GGMLType::F32,     {n_embd, n_exp},
                      0,        router.size() * 4, reinterpret_cast<const uint8_t*>(router.data())};
        Weight wr = be->prepare_weight(rt);
        wr.src = nullptr;
        if (x.ndim() != 2) fail("x must be [n_tok, ", n_embd, "] float32");
        const size_t n_tok = x.shape(0);
        check_rows(x, n_tok, n_embd, "x");
        const std::unique_ptr<Buf> rb = optional_vector(*be, router_bias, n_exp, "router_bias"),
                                   gb = optional_vector(*be, gate_bias, n_exp * n_ff, "gate_bias"),
                                   ub = optional_vector(*be, up_bias, n_exp * n_ff, "up_bias"),
                                   db = optional_vector(*be, down_bias, n_exp * n_embd, "down_bias"),
                                   selb = optional_vector(*be, selection_bias, n_exp, "selection_bias"),
                                   nb_ = optional_vector(*be, norm, n_embd, "norm");
        MoeWeights w;
        w.router = &wr;
        w.router_bias = ptr(rb);
        w.gate = &wg;
        w.up = &wu;
        w.down = &wd;
        w.gate_bias = ptr(gb);
        w.up_bias = ptr(ub);
        w.down_bias = ptr(db);
        w.selection_bias = ptr(selb);
        w.norm = ptr(nb_);
        if (shared_gate) {
            w.shared_gate = &sg;
            w.shared_up = &su;
            w.shared_down = &sd;
        }
        if (shared_gate_inp) w.shared_gate_inp = &sgi;
        w.n_expert = n_exp;
        w.n_used = n_used;
        w.gating = gating_arg(gating);
        w.norm_topk = norm_topk;
        w.weight_scale = weight_scale;
        w.act = activation_arg(act);
        w.weight_input = weight_input;
        if (n_used < 1 || n_used > n_exp) fail("moe: n_used ", n_used, " must lie in 1..", n_exp);
        if (residual) check_rows(*residual, n_tok, n_embd, "moe: residual");
        if (residual && !norm) fail("moe: residual needs norm (the moe_ffn op)");
        Buf xb(*be, x.data(), x.size() * 4), yb(*be, x.size() * 4), xnb(*be, x.size() * 4),
            sb(*be, (size_t)moe_scratch_floats((int64_t)n_tok, n_embd, std::max(n_ff, n_ff_s), n_exp, n_used) * 4);
        const std::unique_ptr<Buf> res = residual ? std::make_unique<Buf>(*be, residual->data(), x.size() * 4)
                                                  : nullptr;
        BlockBuffers b{};
        b.xn = norm ? xnb.f() : xb.f();
        b.moe = sb.f();
        multi_seq_batch(n_seq, batch_invariant, (int32_t)n_tok);
        // With norm: the moe_ffn op on un-normed rows x (+ residual), each run on a fresh copy of them.
        const std::unique_ptr<Buf> x0 = norm ? std::make_unique<Buf>(*be, x.data(), x.size() * 4) : nullptr;
        auto run = [&] {
            if (norm) {
                be->copy(xb.f(), x0->f(), x.size() * 4);
                if (composed) be->Backend::moe_ffn(w, xb.f(), ptr(res), (int32_t)n_tok, b, yb.f());
                else be->moe_ffn(w, xb.f(), ptr(res), (int32_t)n_tok, b, yb.f());
            } else if (composed) {
                be->Backend::moe(w, xb.f(), (int32_t)n_tok, b, yb.f());
            } else {
                be->moe(w, xb.f(), (int32_t)n_tok, b, yb.f());
            }
        };
        if (graph_steps <= 0) run();
        const std::vector<float> zeros(x.size(), 0.0f);
        Buf zb(*be, zeros.data(), zeros.size() * 4);
        for (int32_t i = 0; i < graph_steps; ++i) {
            be->copy(yb.f(), zb.f(), zeros.size() * 4);
            if (!be->step_begin(0x6d6f65)) run();
            be->step_end();
        }
        end_multi_seq_batch(n_seq, (int32_t)n_tok);
        return make_out(download(*be, yb, x.size()), {n_tok, (size_t)n_embd});
    }

    // Backend::moe_route on logits [n_tok][n_expert]: (ids, weights), each [n_tok * n_used].
    std::pair<std::vector<int32_t>, std::vector<float>> moe_route(F32In logits, int32_t n_used,
                                                                  const std::string& gating, bool norm_topk,
                                                                  float weight_scale,
                                                                  std::optional<F32In> selection_bias, int32_t n_group,
                                                                  int32_t n_group_used) {
        if (logits.ndim() != 2 || logits.shape(0) == 0 || logits.shape(1) == 0)
            fail("moe_route: logits must be [n_tok, n_expert] float32");
        const int32_t n_tok = (int32_t)logits.shape(0), n_exp = (int32_t)logits.shape(1);
        if (n_used < 1 || n_used > n_exp) fail("moe_route: n_used ", n_used, " must lie in 1..", n_exp);
        MoeWeights w;
        w.n_expert = n_exp;
        w.n_used = n_used;
        w.gating = gating_arg(gating);
        w.norm_topk = norm_topk;
        w.weight_scale = weight_scale;
        w.n_group = n_group;
        w.n_group_used = n_group_used;
        const std::unique_ptr<Buf> sel = optional_vector(*be, selection_bias, n_exp, "selection_bias");
        w.selection_bias = ptr(sel);
        Buf lb(*be, logits.data(), logits.size() * 4), ib(*be, (size_t)n_tok * n_used * 4),
            wb(*be, (size_t)n_tok * n_used * 4);
        be->moe_route(w, lb.f(), n_tok, static_cast<int32_t*>(ib.p), wb.f());
        std::vector<int32_t> ids((size_t)n_tok * n_used);
        be->synchronize();
        be->copy_to_host(ids.data(), ib.p, ids.size() * 4);
        return {ids, download(*be, wb, ids.size())};
    }

    // Rows of x [n, dim] by index: checked here, since the op assumes them in range.
    Buf row_ids(const std::vector<int32_t>& rows, size_t n, const char* what) {
        for (int32_t r : rows)
            if (r < 0 || (size_t)r >= n) fail(what, ": row ", r, " is outside 0..", n - 1);
        return Buf(*be, rows.data(), rows.size() * 4);
    }

    F32Out gather_rows(F32In x, const std::vector<int32_t>& rows) {
        if (x.ndim() != 2 || rows.empty()) fail("gather_rows: x must be [n, dim] float32 and rows non-empty");
        const size_t dim = x.shape(1);
        const Buf rb = row_ids(rows, x.shape(0), "gather_rows");
        Buf xb(*be, x.data(), x.size() * 4), yb(*be, rows.size() * dim * 4);
        be->gather_rows(xb.f(), static_cast<const int32_t*>(rb.p), (int32_t)rows.size(), (int64_t)dim, yb.f());
        return make_out(download(*be, yb, rows.size() * dim), {rows.size(), dim});
    }

    // out [n, dim] with rows[r] += scale[r] * y[r]; rows distinct.
    F32Out scatter_add_rows(F32In out, F32In y, const std::vector<int32_t>& rows, F32In scale) {
        if (out.ndim() != 2 || rows.empty()) fail("scatter_add_rows: out must be [n, dim] float32 and rows non-empty");
        const size_t dim = out.shape(1);
        check_rows(y, rows.size(), (int64_t)dim, "scatter_add_rows: y");
        if (scale.ndim() != 1 || scale.size() != rows.size())
            fail("scatter_add_rows: scale must be [", rows.size(), "]");
        if (std::set<int32_t>(rows.begin(), rows.end()).size() != rows.size()) fail("scatter_add_rows: rows repeat");
        const Buf rb = row_ids(rows, out.shape(0), "scatter_add_rows");
        Buf ob(*be, out.data(), out.size() * 4), yb(*be, y.data(), y.size() * 4),
            sb(*be, scale.data(), scale.size() * 4);
        be->scatter_add_rows(ob.f(), yb.f(), static_cast<const int32_t*>(rb.p), sb.f(), (int32_t)rows.size(),
                             (int64_t)dim);
        return make_out(download(*be, ob, out.size()), {out.shape(0), dim});
    }

    F32Out scale_softcap(F32In x, float scale, float cap) {
        if (x.ndim() != 1 || x.size() == 0) fail("scale_softcap: x must be [n] float32");
        Buf xb(*be, x.data(), x.size() * 4);
        be->scale_softcap(xb.f(), (int64_t)x.size(), scale, cap);
        return make_out(download(*be, xb, x.size()), {x.size()});
    }

    // (out [n_tok, n_v_heads * head_v], the state after the tokens); state [n_v_heads, head_k, head_v].
    std::pair<F32Out, F32Out> gated_delta_rule(F32In q, F32In k, F32In v, F32In g, F32In beta, F32In state,
                                               int32_t n_k_heads) {
        if (state.ndim() != 3) fail("gated_delta_rule: state must be [n_v_heads, head_k, head_v] float32");
        const DeltaRuleShape s{n_k_heads, (int32_t)state.shape(0), (int32_t)state.shape(1), (int32_t)state.shape(2)};
        if (q.ndim() != 2) fail("gated_delta_rule: q must be [n_tok, n_k_heads * head_k] float32");
        const int32_t n_tok = (int32_t)q.shape(0);
        check_delta_rule_shape(s, n_tok, "gated_delta_rule");
        check_rows(q, n_tok, (int64_t)s.n_k_heads * s.head_k, "gated_delta_rule: q");
        check_rows(k, n_tok, (int64_t)s.n_k_heads * s.head_k, "gated_delta_rule: k");
        check_rows(v, n_tok, (int64_t)s.n_v_heads * s.head_v, "gated_delta_rule: v");
        check_rows(g, n_tok, s.n_v_heads, "gated_delta_rule: g");
        check_rows(beta, n_tok, s.n_v_heads, "gated_delta_rule: beta");
        const size_t n_out = (size_t)n_tok * s.n_v_heads * s.head_v;
        Buf qb(*be, q.data(), q.size() * 4), kb(*be, k.data(), k.size() * 4), vb(*be, v.data(), v.size() * 4),
            gb(*be, g.data(), g.size() * 4), bb(*be, beta.data(), beta.size() * 4),
            sb(*be, state.data(), state.size() * 4), ob(*be, n_out * 4);
        be->gated_delta_rule(qb.f(), kb.f(), vb.f(), gb.f(), bb.f(), n_tok, s, sb.f(), ob.f());
        return {make_out(download(*be, ob, n_out), {(size_t)n_tok, (size_t)s.n_v_heads * s.head_v}),
                make_out(download(*be, sb, state.size()), {state.shape(0), state.shape(1), state.shape(2)})};
    }

    // (y [n_tok, channels], the state after the tokens); w [channels, kernel], state [kernel - 1, channels].
    std::pair<F32Out, F32Out> short_conv(F32In x, F32In w, std::optional<F32In> bias, F32In state, bool silu) {
        if (x.ndim() != 2) fail("short_conv: x must be [n_tok, channels] float32");
        const int32_t n_tok = (int32_t)x.shape(0), channels = (int32_t)x.shape(1);
        if (w.ndim() != 2 || (int32_t)w.shape(0) != channels)
            fail("short_conv: w must be [", channels, ", kernel] float32");
        const int32_t kernel = (int32_t)w.shape(1);
        check_short_conv(n_tok, channels, kernel, "short_conv");
        check_rows(state, (size_t)kernel - 1, channels, "short_conv: state");
        const size_t n_out = (size_t)n_tok * channels;
        Buf xb(*be, x.data(), x.size() * 4), wb(*be, w.data(), w.size() * 4), sb(*be, state.data(), state.size() * 4),
            yb(*be, n_out * 4);
        const std::unique_ptr<Buf> bb = optional_vector(*be, bias, (size_t)channels, "short_conv: bias");
        be->short_conv(xb.f(), wb.f(), ptr(bb), n_tok, channels, kernel, silu, sb.f(), yb.f());
        return {make_out(download(*be, yb, n_out), {(size_t)n_tok, (size_t)channels}),
                make_out(download(*be, sb, state.size()), {(size_t)kernel - 1, (size_t)channels})};
    }

    // (y [n_tok, n_head * head_dim], the state after the tokens); xbc [n_tok, n_head * head_dim +
    // 2 * n_group * d_state], dt [n_tok, n_head], A, dt_bias, D [n_head], state [n_head, head_dim, d_state].
    std::pair<F32Out, F32Out> ssm_scan(F32In xbc, F32In dt, F32In A, std::optional<F32In> dt_bias,
                                       std::optional<F32In> D, F32In state, int32_t n_group) {
        if (state.ndim() != 3) fail("ssm_scan: state must be [n_head, head_dim, d_state] float32");
        const SsmShape s{(int32_t)state.shape(0), (int32_t)state.shape(1), (int32_t)state.shape(2), n_group};
        if (xbc.ndim() != 2) fail("ssm_scan: xbc must be [n_tok, n_head * head_dim + 2 * n_group * d_state] float32");
        const int32_t n_tok = (int32_t)xbc.shape(0);
        check_ssm_shape(s, n_tok, "ssm_scan");
        check_rows(xbc, n_tok, s.xbc_width(), "ssm_scan: xbc");
        check_rows(dt, n_tok, s.n_head, "ssm_scan: dt");
        if (A.ndim() != 1 || A.size() != (size_t)s.n_head) fail("ssm_scan: A must be [", s.n_head, "] float32");
        const size_t n_out = (size_t)n_tok * s.inner();
        Buf xb(*be, xbc.data(), xbc.size() * 4), tb(*be, dt.data(), dt.size() * 4), ab(*be, A.data(), A.size() * 4),
            sb(*be, state.data(), state.size() * 4), yb(*be, n_out * 4);
        const std::unique_ptr<Buf> bb = optional_vector(*be, dt_bias, (size_t)s.n_head, "ssm_scan: dt_bias");
        const std::unique_ptr<Buf> db = optional_vector(*be, D, (size_t)s.n_head, "ssm_scan: D");
        be->ssm_scan(xb.f(), tb.f(), ab.f(), ptr(bb), ptr(db), n_tok, s, sb.f(), yb.f());
        return {make_out(download(*be, yb, n_out), {(size_t)n_tok, (size_t)s.inner()}),
                make_out(download(*be, sb, state.size()), {state.shape(0), state.shape(1), state.shape(2)})};
    }

    F32Out sigmoid(F32In x) {
        if (x.ndim() != 1 || x.size() == 0) fail("sigmoid: x must be [n] float32");
        Buf xb(*be, x.data(), x.size() * 4);
        be->sigmoid(xb.f(), (int64_t)x.size());
        return make_out(download(*be, xb, x.size()), {x.size()});
    }

    F32Out mul(F32In x, F32In y) {
        if (x.ndim() != 1 || x.size() == 0 || y.ndim() != 1 || y.size() != x.size())
            fail("mul: x and y must be [n] float32 of one size");
        Buf xb(*be, x.data(), x.size() * 4), yb(*be, y.data(), y.size() * 4);
        be->mul(xb.f(), yb.f(), (int64_t)x.size());
        return make_out(download(*be, xb, x.size()), {x.size()});
    }

    // x [n_tok, dim]; bias and scale [dim].
    F32Out softplus_gate(F32In x, F32In bias, F32In scale) {
        if (x.ndim() != 2 || bias.ndim() != 1 || scale.ndim() != 1 || bias.size() != x.shape(1) ||
            scale.size() != x.shape(1))
            fail("softplus_gate: x must be [n_tok, dim], bias and scale [dim] float32");
        Buf xb(*be, x.data(), x.size() * 4), bb(*be, bias.data(), bias.size() * 4),
            sb(*be, scale.data(), scale.size() * 4);
        be->softplus_gate(xb.f(), bb.f(), sb.f(), (int32_t)x.shape(0), (int32_t)x.shape(1));
        return make_out(download(*be, xb, x.size()), {x.shape(0), x.shape(1)});
    }

    // dst (1-D, its other elements kept) after copy_rows of src's rows from src_at into it from dst_at.
    F32Out copy_rows(F32In dst, int64_t dst_at, int64_t dst_stride, F32In src, int64_t src_at, int64_t src_stride,
                     int64_t width, int64_t n_rows) {
        if (dst.ndim() != 1 || src.ndim() != 1) fail("copy_rows: dst and src must be [n] float32");
        auto inside = [&](int64_t at, int64_t stride, size_t size) {
            return at >= 0 && (n_rows <= 0 || width <= 0 || at + (n_rows - 1) * stride + width <= (int64_t)size);
        };
        if (!inside(dst_at, dst_stride, dst.size()) || !inside(src_at, src_stride, src.size()))
            fail("copy_rows: the rows reach past dst or src");
        Buf db(*be, dst.data(), dst.size() * 4), sb(*be, src.data(), src.size() * 4);
        be->copy_rows(db.f() + dst_at, dst_stride, sb.f() + src_at, src_stride, width, n_rows);
        return make_out(download(*be, db, dst.size()), {dst.size()});
    }

    // The fused attention input op: x += residual; xn = rmsnorm(x) * norm; q, k, v = projections
    // (+ biases, + per-head norms); rope of q and k at pos; k and v stored in a cache of type_k /
    // type_v (block_size, shuffled blocks). Returns the rotated q, the cached rows of k and v at
    // pos as float, and x after the residual add.
    std::vector<F32Out> attn_in(uint32_t type_id, U8In wq, U8In wk, U8In wv, int64_t n_in, F32In x,
                                std::vector<int32_t> pos, int32_t head_dim, float base, bool neox, int32_t block_size,
                                F32In norm, float eps, std::optional<F32In> residual, std::optional<F32In> bq,
                                std::optional<F32In> bk, std::optional<F32In> bv, std::optional<F32In> q_norm,
                                std::optional<F32In> k_norm, const std::optional<std::string>& kv_type,
                                const std::optional<std::string>& type_k, const std::optional<std::string>& type_v,
                                bool composed, int32_t n_rot, float temp_scale, int32_t temp_length) {
        check_positions(pos, "attn_in");
        Weight q = weight(type_id, wq, n_in, "wq"), k = weight(type_id, wk, n_in, "wk"),
               v = weight(type_id, wv, n_in, "wv");
        if (head_dim <= 0 || k.n_out != v.n_out || q.n_out % head_dim || k.n_out % head_dim)
            fail("attn_in: wk and wv need the same rows, both and wq whole heads of ", head_dim);
        const size_t nt = pos.size();
        const int32_t n_tok = (int32_t)nt;
        check_rows(x, nt, n_in, "x");
        if (residual) check_rows(*residual, nt, n_in, "residual");
        const RopeParams rope = rope_params(head_dim, base, neox, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, std::nullopt, n_rot,
                                            temp_scale, temp_length);
        std::unique_ptr<Buf> nbuf = optional_vector(*be, norm, (size_t)n_in, "norm");
        std::unique_ptr<Buf> bqb = optional_vector(*be, bq, (size_t)q.n_out, "bq"),
                             bkb = optional_vector(*be, bk, (size_t)k.n_out, "bk"),
                             bvb = optional_vector(*be, bv, (size_t)v.n_out, "bv"),
                             qn = optional_vector(*be, q_norm, (size_t)head_dim, "q_norm"),
                             kn = optional_vector(*be, k_norm, (size_t)head_dim, "k_norm");
        const AttnInWeights w{nbuf->f(),
                              eps,
                              &q,
                              &k,
                              &v,
                              ptr(bqb),
                              ptr(bkb),
                              ptr(bvb),
                              ptr(qn),
                              ptr(kn),
                              (int32_t)(q.n_out / head_dim),
                              (int32_t)(k.n_out / head_dim),
                              head_dim,
                              &rope};
        const int32_t len = *std::max_element(pos.begin(), pos.end()) + 1;
        PagedKV paged(*be, len, block_size, w.n_head_kv, head_dim, kv_types_arg(kv_type, type_k, type_v), 7);
        be->set_batch(paged.batch(pos, {}));
        Buf xb(*be, x.data(), x.size() * 4), xn(*be, x.size() * 4), qb(*be, nt * q.n_out * 4),
            kb(*be, nt * k.n_out * 4), vb(*be, nt * v.n_out * 4);
        std::unique_ptr<Buf> rb = residual ? std::make_unique<Buf>(*be, residual->data(), residual->size() * 4)
                                           : nullptr;
        const BlockBuffers b{xn.f(), qb.f(), kb.f(), vb.f(), nullptr, nullptr, nullptr};
        if (composed) be->Backend::attn_in(w, xb.f(), ptr(rb), n_tok, paged.kv, b);
        else be->attn_in(w, xb.f(), ptr(rb), n_tok, paged.kv, b);
        const size_t kw = (size_t)k.n_out;
        return {make_out(download(*be, qb, nt * q.n_out), {nt, (size_t)q.n_out}),
                make_out(paged.rows(*be, false, 0, pos), {nt, kw}), make_out(paged.rows(*be, true, 0, pos), {nt, kw}),
                make_out(download(*be, xb, x.size()), {nt, (size_t)n_in})};
    }

    F32Out rmsnorm(F32In x, F32In gamma, float eps) {
        if (x.ndim() != 2 || gamma.ndim() != 1 || gamma.size() != x.shape(1))
            fail("rmsnorm: x must be [n_tok, dim] and gamma [dim] float32");
        const int32_t n_tok = (int32_t)x.shape(0), dim = (int32_t)x.shape(1);
        Buf xb(*be, x.data(), x.size() * 4), gb(*be, gamma.data(), gamma.size() * 4), yb(*be, x.size() * 4);
        be->rmsnorm(xb.f(), gb.f(), n_tok, dim, eps, yb.f());
        return make_out(download(*be, yb, x.size()), {(size_t)n_tok, (size_t)dim});
    }

    // The fused residual add and norm: x += residual (when given), y = rmsnorm(x) * gamma.
    // Returns (y, x after the add).
    std::vector<F32Out> add_rmsnorm(F32In x, std::optional<F32In> residual, F32In gamma, float eps, bool composed) {
        if (x.ndim() != 2 || gamma.ndim() != 1 || gamma.size() != x.shape(1))
            fail("add_rmsnorm: x must be [n_tok, dim] and gamma [dim] float32");
        const size_t n_tok = x.shape(0), dim = x.shape(1);
        if (residual) check_rows(*residual, n_tok, (int64_t)dim, "add_rmsnorm: residual");
        Buf xb(*be, x.data(), x.size() * 4), gb(*be, gamma.data(), gamma.size() * 4), yb(*be, x.size() * 4);
        std::unique_ptr<Buf> rb = residual ? std::make_unique<Buf>(*be, residual->data(), residual->size() * 4)
                                           : nullptr;
        if (composed) be->Backend::add_rmsnorm(xb.f(), ptr(rb), gb.f(), (int32_t)n_tok, (int32_t)dim, eps, yb.f());
        else be->add_rmsnorm(xb.f(), ptr(rb), gb.f(), (int32_t)n_tok, (int32_t)dim, eps, yb.f());
        return {make_out(download(*be, yb, x.size()), {n_tok, dim}),
                make_out(download(*be, xb, x.size()), {n_tok, dim})};
    }

    // The fused output head: x += residual; xn = rmsnorm(x) * gamma; y = xn W^T. Returns (y, xn, x).
    std::vector<F32Out> norm_matmul(uint32_t type_id, U8In w, F32In x, std::optional<F32In> residual, F32In gamma,
                                    float eps, bool composed) {
        if (x.ndim() != 2 || gamma.ndim() != 1 || gamma.size() != x.shape(1))
            fail("norm_matmul: x must be [n_tok, n_in] and gamma [n_in] float32");
        const size_t n_tok = x.shape(0), n_in = x.shape(1);
        Weight wt = weight(type_id, w, (int64_t)n_in, "weight");
        if (residual) check_rows(*residual, n_tok, (int64_t)n_in, "norm_matmul: residual");
        const size_t n_out = (size_t)wt.n_out;
        Buf xb(*be, x.data(), x.size() * 4), gb(*be, gamma.data(), gamma.size() * 4), xn(*be, x.size() * 4),
            yb(*be, n_tok * n_out * 4);
        std::unique_ptr<Buf> rb = residual ? std::make_unique<Buf>(*be, residual->data(), residual->size() * 4)
                                           : nullptr;
        if (composed) be->Backend::norm_matmul(xb.f(), ptr(rb), gb.f(), eps, wt, (int32_t)n_tok, xn.f(), yb.f());
        else be->norm_matmul(xb.f(), ptr(rb), gb.f(), eps, wt, (int32_t)n_tok, xn.f(), yb.f());
        return {make_out(download(*be, yb, n_tok * n_out), {n_tok, n_out}),
                make_out(download(*be, xn, x.size()), {n_tok, n_in}),
                make_out(download(*be, xb, x.size()), {n_tok, n_in})};
    }

    F32Out head_rmsnorm(F32In x, F32In gamma, int32_t n_heads, int32_t head_dim, float eps) {
        if (n_heads <= 0 || head_dim <= 0 || x.ndim() != 2 || x.shape(1) != (size_t)n_heads * head_dim)
            fail("head_rmsnorm: x must be [n_tok, n_heads * head_dim] float32 with n_heads, head_dim > 0");
        if (gamma.ndim() != 1 || gamma.size() != (size_t)head_dim)
            fail("head_rmsnorm: gamma must be [head_dim] float32");
        Buf xb(*be, x.data(), x.size() * 4), gb(*be, gamma.data(), gamma.size() * 4);
        be->head_rmsnorm(xb.f(), gb.f(), (int32_t)x.shape(0), n_heads, head_dim, eps);
        return make_out(download(*be, xb, x.size()), {x.shape(0), x.shape(1)});
    }

    F32Out rmsnorm_grouped(F32In x, F32In gamma, int32_t n_groups, float eps) {
        if (x.ndim() != 2 || gamma.ndim() != 1 || gamma.size() != x.shape(1))
            fail("rmsnorm_grouped: x must be [n_rows, width] and gamma [width] float32");
        Buf xb(*be, x.data(), x.size() * 4), gb(*be, gamma.data(), gamma.size() * 4);
        be->rmsnorm_grouped(xb.f(), gb.f(), (int32_t)x.shape(0), (int64_t)x.shape(1), n_groups, eps, xb.f());
        return make_out(download(*be, xb, x.size()), {x.shape(0), x.shape(1)});
    }

    F32Out rope(F32In x, std::vector<int32_t> pos, int32_t n_heads, int32_t head_dim, float base, bool neox,
                float freq_scale, float ext_factor, float attn_factor, float corr_lo, float corr_hi,
                std::optional<F32In> freq_factors, int32_t n_rot) {
        check_positions(pos, "rope");
        const RopeParams r = rope_params(head_dim, base, neox, freq_scale, ext_factor, attn_factor, corr_lo, corr_hi,
                                         freq_factors, n_rot);
        if (n_heads <= 0 || x.ndim() != 2 || x.shape(0) != pos.size() || x.shape(1) != (size_t)n_heads * head_dim)
            fail("rope: x must be [len(pos), n_heads * head_dim] float32");
        be->set_batch(one_sequence_batch(pos, {0}));
        Buf xb(*be, x.data(), x.size() * 4);
        be->rope(xb.f(), (int32_t)pos.size(), n_heads, r);
        return make_out(download(*be, xb, x.size()), {x.shape(0), x.shape(1)});
    }

    F32Out gated_act(F32In g, F32In u, const std::string& act) {
        const Activation a = activation_arg(act);
        if (g.size() != u.size()) fail("gated_act: gate and up must have the same size");
        Buf gb(*be, g.data(), g.size() * 4), ub(*be, u.data(), u.size() * 4), ob(*be, g.size() * 4);
        be->gated_act(a, gb.f(), ub.f(), (int64_t)g.size(), ob.f());
        return make_out(download(*be, ob, g.size()), {g.size()});
    }
    // Each row of q [len(pos), width] scaled by the attention temperature at its position.
    F32Out attn_temperature(F32In q, std::vector<int32_t> pos, float temp_scale, int32_t temp_length,
                            int32_t temp_offset) {
        check_positions(pos, "attn_temperature");
        if (q.ndim() != 2 || q.shape(0) != pos.size() || q.shape(1) == 0)
            fail("attn_temperature: q must be [len(pos), width] float32");
        if (temp_length <= 0) fail("attn_temperature: temp_length must be positive, got ", temp_length);
        RopeParams r;
        r.temp_scale = temp_scale;
        r.temp_length = temp_length;
        r.temp_offset = temp_offset;
        be->set_batch(one_sequence_batch(pos, {0}));
        Buf qb(*be, q.data(), q.size() * 4);
        be->attn_temperature(qb.f(), (int32_t)pos.size(), (int64_t)q.shape(1), r);
        return make_out(download(*be, qb, q.size()), {q.shape(0), q.shape(1)});
    }

    F32Out layernorm(F32In x, F32In gamma, std::optional<F32In> beta, float eps) {
        if (x.ndim() != 2 || gamma.ndim() != 1 || gamma.size() != x.shape(1))
            fail("layernorm: x must be [n_tok, dim] and gamma [dim] float32");
        const int32_t n_tok = (int32_t)x.shape(0), dim = (int32_t)x.shape(1);
        Buf xb(*be, x.data(), x.size() * 4), gb(*be, gamma.data(), gamma.size() * 4), yb(*be, x.size() * 4);
        const std::unique_ptr<Buf> bb = optional_vector(*be, beta, (size_t)dim, "layernorm: beta");
        be->layernorm(xb.f(), gb.f(), ptr(bb), n_tok, dim, eps, yb.f());
        return make_out(download(*be, yb, x.size()), {(size_t)n_tok, (size_t)dim});
    }

    F32Out unary(F32In x, const std::string& f) {
        const UnaryOp op = f == "gelu_erf"       ? UnaryOp::GeLUErf
                           : f == "gelu_tanh"    ? UnaryOp::GeLUTanh
                           : f == "tanh"         ? UnaryOp::Tanh
                           : f == "relu_squared" ? UnaryOp::ReLUSquared
                                                 : (fail("unary: f must be 'gelu_erf', 'gelu_tanh', 'tanh' or "
                                                         "'relu_squared', got '",
                                                         f, "'"),
                                                    UnaryOp::Tanh);
        Buf xb(*be, x.data(), x.size() * 4);
        be->unary(op, xb.f(), (int64_t)x.size());
        return make_out(download(*be, xb, x.size()), {x.size()});
    }

    // Bidirectional attention of packed sequences: token t of sequence seq[t] at position pos[t]
    // (a sequence's tokens contiguous), q [n_tok, n_head * head_dim], k and v [n_tok, n_head_kv * head_dim].
    F32Out encoder_attention(F32In q, F32In k, F32In v, std::vector<int32_t> pos, std::vector<int32_t> seq,
                             int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale, int32_t window) {
        const size_t n_tok = pos.size();
        check_positions(pos, "encoder_attention");
        if (seq.size() != n_tok) fail("encoder_attention: seq must have one entry per token");
        if (n_head <= 0 || n_head_kv <= 0 || head_dim <= 0)
            fail("encoder_attention: n_head, n_head_kv and head_dim must be positive");
        check_rows(q, n_tok, (int64_t)n_head * head_dim, "encoder_attention: q");
        check_rows(k, n_tok, (int64_t)n_head_kv * head_dim, "encoder_attention: k");
        check_rows(v, n_tok, (int64_t)n_head_kv * head_dim, "encoder_attention: v");
        BatchInfo b = one_sequence_batch(pos, {});
        b.seq = seq;
        b.n_seq = seq.empty() ? 1 : *std::max_element(seq.begin(), seq.end()) + 1;
        be->set_batch(b);
        Buf qb(*be, q.data(), q.size() * 4), kb(*be, k.data(), k.size() * 4), vb(*be, v.data(), v.size() * 4),
            ob(*be, q.size() * 4);
        AttentionShape shape{n_head, n_head_kv, head_dim, scale, window};
        be->encoder_attention(qb.f(), kb.f(), vb.f(), (int32_t)n_tok, shape, ob.f());
        return make_out(download(*be, ob, q.size()), {n_tok, q.shape(1)});
    }

    // x, y [n] -> x + y (Backend::add, in place on the backend's copy of x).
    F32Out add(F32In x, F32In y) {
        if (x.ndim() != 1 || y.ndim() != 1 || x.size() != y.size()) fail("add: x and y must be [n] float32 of one n");
        Buf xb(*be, x.data(), x.size() * 4), yb(*be, y.data(), y.size() * 4);
        be->add(xb.f(), yb.f(), (int64_t)x.size());
        return make_out(download(*be, xb, x.size()), {x.size()});
    }

    // x [n_tok, dim] + bias [dim] on every row.
    F32Out add_bias(F32In x, F32In bias) {
        if (x.ndim() != 2 || bias.ndim() != 1 || bias.size() != x.shape(1))
            fail("add_bias: x must be [n_tok, dim] and bias [dim] float32");
        Buf xb(*be, x.data(), x.size() * 4), bb(*be, bias.data(), bias.size() * 4);
        be->add_bias(xb.f(), bb.f(), (int32_t)x.shape(0), (int32_t)x.shape(1));
        return make_out(download(*be, xb, x.size()), {x.shape(0), x.shape(1)});
    }

    // x [n_rows, width] -> each row's greedy id (-1 where nothing beats -inf).
    std::vector<int32_t> argmax_rows(F32In x) {
        if (x.ndim() != 2 || x.shape(0) == 0 || x.shape(1) == 0) fail("argmax_rows: x must be [n_rows, width] float32");
        const int32_t n_rows = (int32_t)x.shape(0);
        Buf xb(*be, x.data(), x.size() * 4), ib(*be, (size_t)n_rows * 4);
        be->argmax_rows(xb.f(), n_rows, (int64_t)x.shape(1), static_cast<int32_t*>(ib.p));
        std::vector<int32_t> ids(n_rows);
        be->synchronize();
        be->copy_to_host(ids.data(), ib.p, ids.size() * sizeof(int32_t));
        return ids;
    }

    // A small vector of n elements of type type_id (F32, F16, BF16: norm weights, biases) made
    // usable by Backend::prepare_vector, read back as float32.
    F32Out prepare_vector(uint32_t type_id, U8In data, int64_t n) {
        const TypeTraits* tr = find_type_traits(type_id);
        if (!tr) fail("prepare_vector: unknown type id ", type_id);
        if (n <= 0 || data.ndim() != 1 || data.size() != row_bytes(tr->type, n))
            fail("prepare_vector: ", n, " ", tr->name, " elements need ", row_bytes(tr->type, n), " bytes, got ",
                 data.size());
        GGUFTensor t{"vector", tr->type, {n}, 0, data.size(), data.data()};
        const float* v = be->prepare_vector(t);
        std::vector<float> out((size_t)n);
        be->synchronize();
        be->copy_to_host(out.data(), v, out.size() * 4);
        return make_out(std::move(out), {(size_t)n});
    }

    // The memory ops a KV block's copy on write and an overlapped output copy use: data goes into
    // one buffer, count bytes from src_offset are copied (Backend::copy) to dst_offset of a second
    // buffer that starts as fill, and the second buffer comes back through copy_to_host_async into
    // alloc_host memory.
    nb::ndarray<nb::numpy, uint8_t> copy(U8In data, size_t src_offset, size_t dst_offset, size_t count, uint8_t fill) {
        const size_t n = data.size();
        if (data.ndim() != 1 || src_offset + count > n || dst_offset + count > n)
            fail("copy: ", count, " bytes from ", src_offset, " to ", dst_offset, " do not fit in ", n, " bytes");
        const std::vector<uint8_t> filled(n, fill);
        Buf src(*be, data.data(), n), dst(*be, filled.data(), n);
        be->copy(static_cast<uint8_t*>(dst.p) + dst_offset, static_cast<const uint8_t*>(src.p) + src_offset, count);
        auto* host = static_cast<uint8_t*>(be->alloc_host(std::max<size_t>(n, 1)));
        be->copy_to_host_async(host, dst.p, n);
        be->synchronize();
        auto* out = new std::vector<uint8_t>(host, host + n);
        be->free_host(host);
        nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
        return nb::ndarray<nb::numpy, uint8_t>(out->data(), {n}, owner);
    }

    // Backend::kv_store of k, v [n_tok, n_head_kv * head_dim] at (seq[t], pos[t]) into a KV layer
    // of n_seq sequences of len positions, types as attention's. Returns the K and V caches as
    // they hold every position, [n_seq, len, n_head_kv * head_dim] (NaN where nothing was stored).
    std::vector<F32Out> kv_store(F32In k, F32In v, std::vector<int32_t> pos, std::vector<int32_t> seq, int32_t n_seq,
                                 int32_t len, int32_t n_head_kv, int32_t head_dim, int32_t block_size, uint64_t seed,
                                 const std::optional<std::string>& kv_type, const std::optional<std::string>& type_k,
                                 const std::optional<std::string>& type_v) {
        check_positions(pos, "kv_store");
        if (n_head_kv <= 0 || head_dim <= 0) fail("kv_store: n_head_kv and head_dim must be positive");
        if (seq.size() != pos.size())
            fail("kv_store: one sequence index per position, got ", seq.size(), " for ", pos.size());
        for (size_t t = 0; t < pos.size(); ++t) {
            if (pos[t] >= len) fail("kv_store: position ", pos[t], " outside [0, ", len, ")");
            if (seq[t] < 0 || seq[t] >= n_seq) fail("kv_store: sequence ", seq[t], " outside [0, ", n_seq, ")");
        }
        const size_t width = (size_t)n_head_kv * head_dim;
        check_rows(k, pos.size(), (int64_t)width, "kv_store: k");
        check_rows(v, pos.size(), (int64_t)width, "kv_store: v");
        PagedKV paged(*be, len, block_size, n_head_kv, head_dim, kv_types_arg(kv_type, type_k, type_v), seed, n_seq);
        be->set_batch(paged.batch(pos, seq));
        Buf kb(*be, k.data(), k.size() * 4), vb(*be, v.data(), v.size() * 4);
        be->kv_store(paged.kv, kb.f(), vb.f(), (int32_t)pos.size());
        std::vector<int32_t> all(len);
        std::iota(all.begin(), all.end(), 0);
        std::vector<float> ks, vs;
        for (int32_t s = 0; s < n_seq; ++s) {
            const std::vector<float> kr = paged.rows(*be, false, s, all), vr = paged.rows(*be, true, s, all);
            ks.insert(ks.end(), kr.begin(), kr.end());
            vs.insert(vs.end(), vr.begin(), vr.end());
        }
        return {make_out(std::move(ks), {(size_t)n_seq, (size_t)len, width}),
                make_out(std::move(vs), {(size_t)n_seq, (size_t)len, width})};
    }

    // q [n_q, n_head*hd] at positions pos (each < len); k_all/v_all [len, n_head_kv*hd] are the
    // sequence's keys/values, scattered into blocks through a shuffled block table, stored as
    // type_k / type_v ("f16", "f32", "q8_0"; kv_type: both; default f16); window > 0: a query at p
    // sees p - window < j <= p only. With o_weight (rows of n_head * hd in type o_type), the output
    // projected through it by the fused attn_out op (composed: its default composition). fast: the
    // queries run as a decode step of the engine's default mode, each its own sequence over the
    // same blocks (BatchInfo::fast_attention). batch_invariant: the engine's deterministic mode.
    // sinks: [n_head] sink logits (AttentionShape::sinks). softcap: AttentionShape::softcap. chunk:
    // AttentionShape::chunk.
    F32Out attention(F32In q, F32In k_all, F32In v_all, std::vector<int32_t> pos, int32_t n_head, int32_t n_head_kv,
                     int32_t head_dim, int32_t block_size, uint64_t seed, const std::optional<std::string>& kv_type,
                     const std::optional<std::string>& type_k, const std::optional<std::string>& type_v, int32_t window,
                     uint32_t o_type, std::optional<U8In> o_weight, bool fast, bool composed, bool batch_invariant,
                     std::optional<F32In> sinks, float softcap, int32_t chunk) {
        check_positions(pos, "attention");
        if (n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 || n_head % n_head_kv)
            fail("attention: n_head must be a positive multiple of n_head_kv, head_dim positive");
        if (window < 0) fail("attention: window must be >= 0 (0: no window), got ", window);
        const size_t kw = (size_t)n_head_kv * head_dim, qw = (size_t)n_head * head_dim;
        if (k_all.ndim() != 2 || k_all.shape(1) != kw || v_all.ndim() != 2 || v_all.shape(0) != k_all.shape(0) ||
            v_all.shape(1) != kw)
            fail("attention: k_all, v_all must be [len, n_head_kv * head_dim] float32");
        check_rows(q, pos.size(), (int64_t)qw, "attention: q");
        const int32_t len = (int32_t)k_all.shape(0);
        for (int32_t p : pos)
            if (p >= len) fail("attention: position ", p, " outside [0, ", len, ")");
        PagedKV paged(*be, len, block_size, n_head_kv, head_dim, kv_types_arg(kv_type, type_k, type_v), seed);
        std::vector<int32_t> all_pos(len);
        std::iota(all_pos.begin(), all_pos.end(), 0);
        be->set_batch(paged.batch(all_pos, {}));
        Buf ks(*be, k_all.data(), k_all.size() * 4), vs(*be, v_all.data(), v_all.size() * 4);
        be->kv_store(paged.kv, ks.f(), vs.f(), len);
        BatchInfo qbatch = paged.batch(pos, {});
        if (fast) {
            qbatch.n_seq = (int32_t)pos.size();
            qbatch.block_table.clear();
            for (int32_t t = 0; t < qbatch.n_seq; ++t) {
                qbatch.seq[t] = t;
                qbatch.block_table.insert(qbatch.block_table.end(), paged.table.begin(), paged.table.end());
            }
            qbatch.fast_attention = true;
        }
        qbatch.batch_invariant = batch_invariant;
        be->set_batch(qbatch);
        Buf qb(*be, q.data(), q.size() * 4), ob(*be, q.size() * 4);
        AttentionShape shape{n_head, n_head_kv, head_dim, 1.0f / std::sqrt((float)head_dim)};
        shape.window = window;
        const std::unique_ptr<Buf> sink_buf = optional_vector(*be, sinks, n_head, "attention: sinks");
        shape.sinks = ptr(sink_buf);
        shape.softcap = softcap;
        shape.chunk = chunk;
        const int32_t n_tok = (int32_t)pos.size();
        if (!o_weight) {
            be->attention(paged.kv, qb.f(), n_tok, shape, ob.f());
            return make_out(download(*be, ob, q.size()), {q.shape(0), q.shape(1)});
        }
        const Weight wo = weight(o_type, *o_weight, (int64_t)qw, "o_weight");
        Buf yb(*be, pos.size() * wo.n_out * 4);
        BlockBuffers b{};
        b.q = qb.f();
        b.att = ob.f();
        if (composed) be->Backend::attn_out(paged.kv, shape, wo, n_tok, b, yb.f());
        else be->attn_out(paged.kv, shape, wo, n_tok, b, yb.f());
        return make_out(download(*be, yb, pos.size() * wo.n_out), {pos.size(), (size_t)wo.n_out});
    }
};

// The contract's ops (backend.h's Backend members that compute or move data for a forward pass),
// each with the method of Backend below that runs it. tests/test_backend_ops.py compares this
// with backend.h and with the ops it checks, so an op cannot join the contract unchecked.
std::vector<std::pair<std::string, std::string>> contract_ops() {
    return {{"matmul", "matmul"},
            {"matmul_many", "matmul_many"},
            {"rmsnorm", "rmsnorm"},
            {"head_rmsnorm", "head_rmsnorm"},
            {"rmsnorm_grouped", "rmsnorm_grouped"},
            {"rope", "rope"},
            {"attn_temperature", "attn_temperature"},
            {"kv_store", "kv_store"},
            {"attention", "attention"},
            {"gated_act", "gated_act"},
            {"add", "add"},
            {"add_bias", "add_bias"},
            {"argmax_rows", "argmax_rows"},
            {"add_rmsnorm", "add_rmsnorm"},
            {"norm_matmul", "norm_matmul"},
            {"attn_in", "attn_in"},
            {"attn_out", "attention"},
            {"ffn", "ffn"},
            {"prepare_weight", "matmul"},
            {"prepare_vector", "prepare_vector"},
            {"copy", "copy"},
            {"copy_to_host_async", "copy"},
            {"alloc_host", "copy"},
            {"free_host", "copy"},
            {"moe_route", "moe_route"},
            {"gather_rows", "gather_rows"},
            {"scatter_add_rows", "scatter_add_rows"},
            {"sigmoid", "sigmoid"},
            {"mul", "mul"},
            {"softplus_gate", "softplus_gate"},
            {"copy_rows", "copy_rows"},
            {"scale_softcap", "scale_softcap"},
            {"gated_delta_rule", "gated_delta_rule"},
            {"short_conv", "short_conv"},
            {"ssm_scan", "ssm_scan"},
            {"moe", "moe"},
            {"moe_ffn", "moe"},
            {"layernorm", "layernorm"},
            {"unary", "unary"},
            {"encoder_attention", "encoder_attention"}};
}

// Every type the quant tables know, name -> ggml type id.
std::vector<std::pair<std::string, uint32_t>> known_types() {
    std::vector<std::pair<std::string, uint32_t>> out;
    for (uint32_t id = 0; id < 256; ++id)
        if (const TypeTraits* t = find_type_traits(id)) out.emplace_back(t->name, id);
    return out;
}

}  // namespace

void bind_kernel_backend(nb::module_& m) {
    m.def("backend_names", &backend_names, "The backends built into this ember, by registry name.");
    m.def("contract_ops", &contract_ops, "(contract op, Backend method that runs it) for every op of backend.h.");
    m.def("known_types", &known_types, "(name, ggml type id) of every type the quant tables know.");
    nb::class_<PyBackend>(m, "Backend")
        .def(nb::init<const std::string&, int, int, const std::map<std::string, std::string>&>(),
             nb::arg("kind") = "cpu", nb::arg("n_threads") = 2, nb::arg("device") = 0,
             nb::arg("switches") = std::map<std::string, std::string>{})
        .def_prop_ro("name", [](const PyBackend& b) { return std::string(b.be->name()); })
        .def_prop_ro("is_host", [](const PyBackend& b) { return b.be->is_host(); })
        .def("matmul", &PyBackend::matmul, nb::arg("type_id"), nb::arg("weight"), nb::arg("n_in"), nb::arg("x"),
             nb::arg("n_seq") = nb::none(), nb::arg("batch_invariant") = false)
        .def("matmul_many", &PyBackend::matmul_many, nb::arg("type_ids"), nb::arg("weights"), nb::arg("n_in"),
             nb::arg("x"), nb::arg("n_seq") = nb::none(), nb::arg("batch_invariant") = false,
             nb::arg("composed") = false)
        .def("attn_in", &PyBackend::attn_in, nb::arg("type_id"), nb::arg("wq"), nb::arg("wk"), nb::arg("wv"),
             nb::arg("n_in"), nb::arg("x"), nb::arg("pos"), nb::arg("head_dim"), nb::arg("base"), nb::arg("neox"),
             nb::arg("block_size"), nb::arg("norm"), nb::arg("eps") = 1e-5f, nb::arg("residual") = nb::none(),
             nb::arg("bq") = nb::none(), nb::arg("bk") = nb::none(), nb::arg("bv") = nb::none(),
             nb::arg("q_norm") = nb::none(), nb::arg("k_norm") = nb::none(), nb::arg("kv_type") = nb::none(),
             nb::arg("type_k") = nb::none(), nb::arg("type_v") = nb::none(), nb::arg("composed") = false,
             nb::arg("n_rot") = 0, nb::arg("temp_scale") = 0.0f, nb::arg("temp_length") = 0)
        .def("rmsnorm", &PyBackend::rmsnorm, nb::arg("x"), nb::arg("gamma"), nb::arg("eps"))
        .def("add_rmsnorm", &PyBackend::add_rmsnorm, nb::arg("x"), nb::arg("residual"), nb::arg("gamma"),
             nb::arg("eps"), nb::arg("composed") = false)
        .def("norm_matmul", &PyBackend::norm_matmul, nb::arg("type_id"), nb::arg("weight"), nb::arg("x"),
             nb::arg("residual"), nb::arg("gamma"), nb::arg("eps"), nb::arg("composed") = false)
        .def("head_rmsnorm", &PyBackend::head_rmsnorm, nb::arg("x"), nb::arg("gamma"), nb::arg("n_heads"),
             nb::arg("head_dim"), nb::arg("eps"))
        .def("rmsnorm_grouped", &PyBackend::rmsnorm_grouped, nb::arg("x"), nb::arg("gamma"), nb::arg("n_groups"),
             nb::arg("eps"))
        .def("rope", &PyBackend::rope, nb::arg("x"), nb::arg("pos"), nb::arg("n_heads"), nb::arg("head_dim"),
             nb::arg("base"), nb::arg("neox"), nb::arg("freq_scale") = 1.0f, nb::arg("ext_factor") = 0.0f,
             nb::arg("attn_factor") = 1.0f, nb::arg("corr_lo") = 0.0f, nb::arg("corr_hi") = 0.0f,
             nb::arg("freq_factors") = nb::none(), nb::arg("n_rot") = 0)
        .def("attn_temperature", &PyBackend::attn_temperature, nb::arg("q"), nb::arg("pos"), nb::arg("temp_scale"),
             nb::arg("temp_length"), nb::arg("temp_offset") = 0)
        .def("gated_act", &PyBackend::gated_act, nb::arg("gate"), nb::arg("up"), nb::arg("act") = "silu")
        .def("layernorm", &PyBackend::layernorm, nb::arg("x"), nb::arg("gamma"), nb::arg("beta"), nb::arg("eps"))
        .def("unary", &PyBackend::unary, nb::arg("x"), nb::arg("f"))
        .def("encoder_attention", &PyBackend::encoder_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"),
             nb::arg("pos"), nb::arg("seq"), nb::arg("n_head"), nb::arg("n_head_kv"), nb::arg("head_dim"),
             nb::arg("scale"), nb::arg("window") = 0)
        .def("add", &PyBackend::add, nb::arg("x"), nb::arg("y"))
        .def("add_bias", &PyBackend::add_bias, nb::arg("x"), nb::arg("bias"))
        .def("argmax_rows", &PyBackend::argmax_rows, nb::arg("x"))
        .def("prepare_vector", &PyBackend::prepare_vector, nb::arg("type_id"), nb::arg("data"), nb::arg("n"))
        .def("copy", &PyBackend::copy, nb::arg("data"), nb::arg("src_offset"), nb::arg("dst_offset"), nb::arg("count"),
             nb::arg("fill") = 0xff)
        .def("kv_store", &PyBackend::kv_store, nb::arg("k"), nb::arg("v"), nb::arg("pos"), nb::arg("seq"),
             nb::arg("n_seq"), nb::arg("len"), nb::arg("n_head_kv"), nb::arg("head_dim"), nb::arg("block_size"),
             nb::arg("seed") = 0, nb::arg("kv_type") = nb::none(), nb::arg("type_k") = nb::none(),
             nb::arg("type_v") = nb::none())
        .def("attention", &PyBackend::attention, nb::arg("q"), nb::arg("k_all"), nb::arg("v_all"), nb::arg("pos"),
             nb::arg("n_head"), nb::arg("n_head_kv"), nb::arg("head_dim"), nb::arg("block_size"), nb::arg("seed") = 0,
             nb::arg("kv_type") = nb::none(), nb::arg("type_k") = nb::none(), nb::arg("type_v") = nb::none(),
             nb::arg("window") = 0, nb::arg("o_type") = 0, nb::arg("o_weight") = nb::none(), nb::arg("fast") = false,
             nb::arg("composed") = false, nb::arg("batch_invariant") = false, nb::arg("sinks") = nb::none(),
             nb::arg("softcap") = 0.0f, nb::arg("chunk") = 0)
        .def("moe", &PyBackend::moe, nb::arg("type_id"), nb::arg("gate"), nb::arg("up"), nb::arg("down"),
             nb::arg("router"), nb::arg("x"), nb::arg("n_used"), nb::arg("gating") = "softmax",
             nb::arg("norm_topk") = false, nb::arg("weight_scale") = 1.0f, nb::arg("act") = "silu",
             nb::arg("router_bias") = nb::none(), nb::arg("gate_bias") = nb::none(), nb::arg("up_bias") = nb::none(),
             nb::arg("down_bias") = nb::none(), nb::arg("n_seq") = nb::none(), nb::arg("batch_invariant") = false,
             nb::arg("composed") = false, nb::arg("graph_steps") = 0, nb::arg("selection_bias") = nb::none(),
             nb::arg("shared_gate") = nb::none(), nb::arg("shared_up") = nb::none(),
             nb::arg("shared_down") = nb::none(), nb::arg("shared_gate_inp") = nb::none(), nb::arg("norm") = nb::none(),
             nb::arg("residual") = nb::none(), nb::arg("weight_input") = false)
        .def("moe_route", &PyBackend::moe_route, nb::arg("logits"), nb::arg("n_used"), nb::arg("gating") = "softmax",
             nb::arg("norm_topk") = false, nb::arg("weight_scale") = 1.0f, nb::arg("selection_bias") = nb::none(),
             nb::arg("n_group") = 0, nb::arg("n_group_used") = 0)
        .def("gather_rows", &PyBackend::gather_rows, nb::arg("x"), nb::arg("rows"))
        .def("scatter_add_rows", &PyBackend::scatter_add_rows, nb::arg("out"), nb::arg("y"), nb::arg("rows"),
             nb::arg("scale"))
        .def("sigmoid", &PyBackend::sigmoid, nb::arg("x"))
        .def("mul", &PyBackend::mul, nb::arg("x"), nb::arg("y"))
        .def("softplus_gate", &PyBackend::softplus_gate, nb::arg("x"), nb::arg("bias"), nb::arg("scale"))
        .def("copy_rows", &PyBackend::copy_rows, nb::arg("dst"), nb::arg("dst_at"), nb::arg("dst_stride"),
             nb::arg("src"), nb::arg("src_at"), nb::arg("src_stride"), nb::arg("width"), nb::arg("n_rows"))
        .def("scale_softcap", &PyBackend::scale_softcap, nb::arg("x"), nb::arg("scale"), nb::arg("cap"))
        .def("gated_delta_rule", &PyBackend::gated_delta_rule, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
             nb::arg("beta"), nb::arg("state"), nb::arg("n_k_heads"))
        .def("short_conv", &PyBackend::short_conv, nb::arg("x"), nb::arg("w"), nb::arg("bias"), nb::arg("state"),
             nb::arg("silu") = false)
        .def("ssm_scan", &PyBackend::ssm_scan, nb::arg("xbc"), nb::arg("dt"), nb::arg("A"), nb::arg("dt_bias"),
             nb::arg("D"), nb::arg("state"), nb::arg("n_group"))
        .def("ffn", &PyBackend::ffn, nb::arg("type_id"), nb::arg("gate"), nb::arg("up"), nb::arg("down"),
             nb::arg("n_in"), nb::arg("x"), nb::arg("norm"), nb::arg("eps") = 1e-5f, nb::arg("residual") = nb::none(),
             nb::arg("act") = "silu", nb::arg("composed") = false);
}
