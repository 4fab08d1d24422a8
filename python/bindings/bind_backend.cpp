// Python access to single backend ops on numpy arrays, so every kernel (CPU SIMD, CUDA) can be
// tested against a reference on fresh random data. Each call copies inputs in and results out.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "ember/quant.h"
#include "ember/status.h"
#include "backend/kv_layout.h"
#include "kv_type_arg.h"
#include "backend/backend.h"

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
    ~Buf() { be.free(p); }
    float* f() { return static_cast<float*>(p); }
};

std::vector<float> download(Backend& be, Buf& b, size_t n) {
    std::vector<float> out(n);
    be.synchronize();
    be.copy_to_host(out.data(), b.p, n * sizeof(float));
    return out;
}

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

// One sequence's KV layer of len positions, in blocks taken from a shuffled list with spares (so
// block ids are not simply 0..n-1). Every byte starts as 0xff (f16 NaN): a kernel that lets a
// row it was not given into its result shows as NaN.
struct PagedKV {
    KVLayer kv;
    std::vector<int32_t> table;
    std::unique_ptr<Buf> k, v;
    PagedKV(Backend& be, int32_t len, int32_t block_size, int32_t n_head_kv, int32_t head_dim, GGMLType type, uint64_t seed) {
        const int32_t n_used = (len + block_size - 1) / block_size;
        kv.n_blocks = n_used * 2;
        std::vector<int32_t> ids(kv.n_blocks);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
        table.assign(ids.begin(), ids.begin() + n_used);
        kv.block_size = block_size;
        kv.n_head_kv = n_head_kv;
        kv.head_dim = head_dim;
        kv.type = type;
        check_kv_type(type, head_dim);
        const size_t bytes = (size_t)kv.n_blocks * kv_block_bytes(type, block_size, (int64_t)n_head_kv * head_dim);
        const std::vector<uint8_t> nan_bytes(bytes, 0xff);
        k = std::make_unique<Buf>(be, nan_bytes.data(), bytes);
        v = std::make_unique<Buf>(be, nan_bytes.data(), bytes);
        kv.k = k->p;
        kv.v = v->p;
    }
    // The f16 rows of positions pos in cache c, as float [len(pos)][n_head_kv * head_dim].
    std::vector<float> rows(Backend& be, Buf& c, const std::vector<int32_t>& pos) const {
        const size_t width = (size_t)kv.n_head_kv * kv.head_dim;
        std::vector<uint16_t> all((size_t)kv.n_blocks * kv.block_size * width);
        be.synchronize();
        be.copy_to_host(all.data(), c.p, all.size() * 2);
        std::vector<float> out;
        for (int32_t p : pos) {
            const size_t row = (size_t)table[p / kv.block_size] * kv.block_size + p % kv.block_size;
            for (size_t i = 0; i < width; ++i) out.push_back(fp16_to_fp32(all[row * width + i]));
        }
        return out;
    }
};

struct PyBackend {
    std::unique_ptr<Backend> be;
    PyBackend(const std::string& kind, int n_threads) {
        if (kind == "cpu") be = make_cpu_backend(n_threads);
        else if (kind == "cuda") be = make_cuda_backend(0);
        else fail("backend kind must be 'cpu' or 'cuda', got '", kind, "'");
    }

    // A weight of n_in-element rows in type type_id, as the backend keeps it.
    Weight weight(uint32_t type_id, const U8In& w, int64_t n_in, const char* what) {
        const TypeTraits* tr = find_type_traits(type_id);
        if (!tr) fail("unknown type id ", type_id);
        if (w.ndim() != 2 || w.shape(1) != row_bytes(tr->type, n_in))
            fail(what, " must be [n_out, ", row_bytes(tr->type, n_in), "] bytes for ", n_in, " ", tr->name,
                 " elements per row");
        GGUFTensor t{what, tr->type, {n_in, (int64_t)w.shape(0)}, 0, w.size(), w.data()};
        Weight out = be->prepare_weight(t);
        out.src = nullptr;   // (t is gone after this call; only streamed weights read src)
        return out;
    }

    F32Out matmul(uint32_t type_id, U8In w, int64_t n_in, F32In x) {
        Weight wt = weight(type_id, w, n_in, "weight");
        if (x.ndim() != 2 || (int64_t)x.shape(1) != n_in) fail("x must be [n_tok, ", n_in, "] float32");
        const int32_t n_tok = (int32_t)x.shape(0);
        const int64_t n_out = wt.n_out;
        Buf xb(*be, x.data(), x.size() * sizeof(float)), yb(*be, (size_t)n_tok * n_out * sizeof(float));
        be->matmul(wt, xb.f(), n_tok, yb.f());
        return make_out(download(*be, yb, (size_t)n_tok * n_out), {(size_t)n_tok, (size_t)n_out});
    }

    // A feed-forward block, its ops called as a model calls them (a backend may fuse them):
    // down(silu(x gate^T) * (x up^T)); gate and up [n_ff] rows of n_in, down [n_in] rows of n_ff.
    F32Out ffn(uint32_t type_id, U8In gate, U8In up, U8In down, int64_t n_in, F32In x) {
        Weight wg = weight(type_id, gate, n_in, "gate"), wu = weight(type_id, up, n_in, "up");
        const int64_t n_ff = wg.n_out;
        Weight wd = weight(type_id, down, n_ff, "down");
        if (wu.n_out != n_ff || wd.n_out != n_in) fail("ffn: gate and up need n_ff rows, down n_in rows");
        if (x.ndim() != 2 || (int64_t)x.shape(1) != n_in) fail("x must be [n_tok, ", n_in, "] float32");
        const size_t n_tok = x.shape(0);
        Buf xb(*be, x.data(), x.size() * 4), gb(*be, n_tok * n_ff * 4), ub(*be, n_tok * n_ff * 4),
            hb(*be, n_tok * n_ff * 4), yb(*be, x.size() * 4);
        be->matmul(wg, xb.f(), (int32_t)n_tok, gb.f());
        be->matmul(wu, xb.f(), (int32_t)n_tok, ub.f());
        be->swiglu(gb.f(), ub.f(), (int64_t)(n_tok * n_ff), hb.f());
        be->matmul(wd, hb.f(), (int32_t)n_tok, yb.f());
        return make_out(download(*be, yb, x.size()), {n_tok, (size_t)n_in});
    }

    // An attention block's input side, its ops called as a model calls them (a backend may fuse
    // them): q, k, v = x wq^T, x wk^T, x wv^T (one type, rows of n_in); rope of q and k at pos;
    // k and v stored in an f16 cache (block_size, shuffled blocks). Returns the rotated q and k and
    // the cached rows of k and v at pos, as float.
    std::vector<F32Out> qkv_rope_store(uint32_t type_id, U8In wq, U8In wk, U8In wv, int64_t n_in, F32In x,
                                       std::vector<int32_t> pos, int32_t head_dim, float base, bool neox,
                                       int32_t block_size) {
        Weight q = weight(type_id, wq, n_in, "wq"), k = weight(type_id, wk, n_in, "wk"), v = weight(type_id, wv, n_in, "wv");
        const int32_t n_tok = (int32_t)pos.size();
        if (x.ndim() != 2 || x.shape(0) != pos.size() || (int64_t)x.shape(1) != n_in)
            fail("x must be [len(pos), ", n_in, "] float32");
        if (k.n_out != v.n_out || q.n_out % head_dim || k.n_out % head_dim)
            fail("qkv_rope_store: wk and wv need the same rows, both and wq whole heads of ", head_dim);
        const int32_t len = *std::max_element(pos.begin(), pos.end()) + 1;
        PagedKV paged(*be, len, block_size, (int32_t)(k.n_out / head_dim), head_dim, GGMLType::F16, 7);
        be->set_batch(one_sequence_batch(pos, paged.table));
        Buf xb(*be, x.data(), x.size() * 4), qb(*be, n_tok * q.n_out * 4), kb(*be, n_tok * k.n_out * 4),
            vb(*be, n_tok * v.n_out * 4);
        be->matmul(q, xb.f(), n_tok, qb.f());
        be->matmul(k, xb.f(), n_tok, kb.f());
        be->matmul(v, xb.f(), n_tok, vb.f());
        be->rope(qb.f(), n_tok, (int32_t)(q.n_out / head_dim), head_dim, base, neox);
        be->rope(kb.f(), n_tok, (int32_t)(k.n_out / head_dim), head_dim, base, neox);
        be->kv_store(paged.kv, kb.f(), vb.f(), n_tok);
        const size_t nt = pos.size(), kw = (size_t)k.n_out;
        std::vector<F32Out> out;
        out.push_back(make_out(download(*be, qb, nt * q.n_out), {nt, (size_t)q.n_out}));
        out.push_back(make_out(download(*be, kb, nt * kw), {nt, kw}));
        out.push_back(make_out(paged.rows(*be, *paged.k, pos), {nt, kw}));
        out.push_back(make_out(paged.rows(*be, *paged.v, pos), {nt, kw}));
        return out;
    }

    F32Out rmsnorm(F32In x, F32In gamma, float eps) {
        const int32_t n_tok = (int32_t)x.shape(0), dim = (int32_t)x.shape(1);
        if (x.ndim() != 2 || gamma.size() != (size_t)dim) fail("rmsnorm: x [n_tok, dim] and gamma [dim]");
        Buf xb(*be, x.data(), x.size() * 4), gb(*be, gamma.data(), gamma.size() * 4), yb(*be, x.size() * 4);
        be->rmsnorm(xb.f(), gb.f(), n_tok, dim, eps, yb.f());
        return make_out(download(*be, yb, x.size()), {(size_t)n_tok, (size_t)dim});
    }

    F32Out rope(F32In x, std::vector<int32_t> pos, int32_t n_heads, int32_t head_dim, float base, bool neox) {
        if (x.ndim() != 2 || x.shape(0) != pos.size() || x.shape(1) != (size_t)n_heads * head_dim)
            fail("rope: x must be [len(pos), n_heads * head_dim]");
        be->set_batch(one_sequence_batch(pos, {0}));
        Buf xb(*be, x.data(), x.size() * 4);
        be->rope(xb.f(), (int32_t)pos.size(), n_heads, head_dim, base, neox);
        return make_out(download(*be, xb, x.size()), {x.shape(0), x.shape(1)});
    }

    F32Out swiglu(F32In g, F32In u) {
        if (g.size() != u.size()) fail("swiglu: gate and up must have the same size");
        Buf gb(*be, g.data(), g.size() * 4), ub(*be, u.data(), u.size() * 4), ob(*be, g.size() * 4);
        be->swiglu(gb.f(), ub.f(), (int64_t)g.size(), ob.f());
        return make_out(download(*be, ob, g.size()), {g.size()});
    }

    // q [n_q, n_head*hd] at positions pos (each < len); k_all/v_all [len, n_head_kv*hd] are the
    // sequence's keys/values, scattered into blocks through a shuffled block table, stored as
    // kv_type ("f16", "f32", "q8_0"). With o_weight (rows of n_head * hd in type o_type), the
    // output projected through it, as the model's next op (a backend may fuse the two).
    F32Out attention(F32In q, F32In k_all, F32In v_all, std::vector<int32_t> pos, int32_t n_head,
                     int32_t n_head_kv, int32_t head_dim, int32_t block_size, uint64_t seed,
                     const std::string& kv_type, uint32_t o_type, std::optional<U8In> o_weight) {
        const int32_t len = (int32_t)k_all.shape(0);
        const size_t kw = (size_t)n_head_kv * head_dim, qw = (size_t)n_head * head_dim;
        if (k_all.ndim() != 2 || k_all.shape(1) != kw || v_all.size() != k_all.size())
            fail("attention: k_all, v_all must be [len, n_head_kv * head_dim]");
        if (q.ndim() != 2 || q.shape(0) != pos.size() || q.shape(1) != qw)
            fail("attention: q must be [len(pos), n_head * head_dim]");
        for (int32_t p : pos) if (p < 0 || p >= len) fail("attention: position ", p, " outside [0, ", len, ")");
        PagedKV paged(*be, len, block_size, n_head_kv, head_dim, kv_type_arg(kv_type), seed);
        KVLayer& kv = paged.kv;
        const std::vector<int32_t>& table = paged.table;
        std::vector<int32_t> all_pos(len);
        std::iota(all_pos.begin(), all_pos.end(), 0);
        be->set_batch(one_sequence_batch(all_pos, table));
        Buf ks(*be, k_all.data(), k_all.size() * 4), vs(*be, v_all.data(), v_all.size() * 4);
        be->kv_store(kv, ks.f(), vs.f(), len);
        be->set_batch(one_sequence_batch(pos, table));
        Buf qb(*be, q.data(), q.size() * 4), ob(*be, q.size() * 4);
        const AttentionShape shape{n_head, n_head_kv, head_dim, 1.0f / std::sqrt((float)head_dim)};
        if (!o_weight) {
            be->attention(kv, qb.f(), (int32_t)pos.size(), shape, ob.f());
            return make_out(download(*be, ob, q.size()), {q.shape(0), q.shape(1)});
        }
        // (the projection is set up first: the matmul directly follows the attention)
        const Weight wo = weight(o_type, *o_weight, (int64_t)qw, "o_weight");
        Buf yb(*be, pos.size() * wo.n_out * 4);
        be->attention(kv, qb.f(), (int32_t)pos.size(), shape, ob.f());
        be->matmul(wo, ob.f(), (int32_t)pos.size(), yb.f());
        return make_out(download(*be, yb, pos.size() * wo.n_out), {pos.size(), (size_t)wo.n_out});
    }
};

}  // namespace

void bind_backend(nb::module_& m) {
    nb::class_<PyBackend>(m, "Backend")
        .def(nb::init<const std::string&, int>(), nb::arg("kind") = "cpu", nb::arg("n_threads") = 2)
        .def_prop_ro("name", [](const PyBackend& b) { return std::string(b.be->name()); })
        .def("matmul", &PyBackend::matmul, nb::arg("type_id"), nb::arg("weight"), nb::arg("n_in"), nb::arg("x"))
        .def("qkv_rope_store", &PyBackend::qkv_rope_store, nb::arg("type_id"), nb::arg("wq"), nb::arg("wk"), nb::arg("wv"),
             nb::arg("n_in"), nb::arg("x"), nb::arg("pos"), nb::arg("head_dim"), nb::arg("base"), nb::arg("neox"),
             nb::arg("block_size"))
        .def("rmsnorm", &PyBackend::rmsnorm, nb::arg("x"), nb::arg("gamma"), nb::arg("eps"))
        .def("rope", &PyBackend::rope, nb::arg("x"), nb::arg("pos"), nb::arg("n_heads"), nb::arg("head_dim"),
             nb::arg("base"), nb::arg("neox"))
        .def("swiglu", &PyBackend::swiglu, nb::arg("gate"), nb::arg("up"))
        .def("attention", &PyBackend::attention, nb::arg("q"), nb::arg("k_all"), nb::arg("v_all"), nb::arg("pos"),
             nb::arg("n_head"), nb::arg("n_head_kv"), nb::arg("head_dim"), nb::arg("block_size"),
             nb::arg("seed") = 0, nb::arg("kv_type") = "f16", nb::arg("o_type") = 0, nb::arg("o_weight") = nb::none())
        .def("ffn", &PyBackend::ffn, nb::arg("type_id"), nb::arg("gate"), nb::arg("up"), nb::arg("down"), nb::arg("n_in"),
             nb::arg("x"));
}
