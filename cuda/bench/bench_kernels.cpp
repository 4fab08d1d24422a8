// ember-cuda-bench: times the CUDA backend's ops in isolation on random data (decode GEMV per
// weight type in GB/s of weight bytes, prompt GEMM in TFLOP/s, matmuls of batched decode steps
// and the gemm_dq kernel per format in GB/s of weight bytes, paged attention in GB/s of K/V bytes) and prints markdown tables. Ratios are against the device's own copy bandwidth,
// measured in the same run.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cuda_backend.h"
#include "kernel_choice.h"
#include "kernels.h"
#include "launch.h"
#include "weight_pack.h"

using namespace ember;

namespace {

std::mt19937_64 rng(1234);

// Random blocks with finite small fp16 scales at the format's scale offsets.
std::vector<uint8_t> random_weight(GGMLType t, int64_t n_out, int64_t n_in) {
    const TypeTraits& bi = cuda::block_info(t);
    const int64_t n_blocks = n_out * (n_in / bi.block_elems);
    std::vector<uint8_t> w(size_t(n_blocks) * bi.block_bytes);
    std::uniform_int_distribution<int> byte(0, 255);
    std::normal_distribution<float> nd(0.f, 1.f);
    if (t == GGMLType::F32) {
        float* f = reinterpret_cast<float*>(w.data());
        for (int64_t i = 0; i < n_blocks; ++i) f[i] = nd(rng);
        return w;
    }
    if (t == GGMLType::F16 || t == GGMLType::BF16) {
        uint16_t* h = reinterpret_cast<uint16_t*>(w.data());
        for (int64_t i = 0; i < n_blocks; ++i) {
            const float v = nd(rng);
            if (t == GGMLType::F16) {
                h[i] = __half_as_ushort(__float2half(v));
            } else {
                uint32_t u;
                std::memcpy(&u, &v, 4);
                h[i] = uint16_t(u >> 16);
            }
        }
        return w;
    }
    for (auto& b : w) b = uint8_t(byte(rng));
    if (t == GGMLType::MXFP4) { // e8m0 exponents: values up to 6 * 2^(e - 127)
        std::uniform_int_distribution<int> e(118, 123);
        for (int64_t b = 0; b < n_blocks; ++b) w[size_t(b) * bi.block_bytes] = uint8_t(e(rng));
        return w;
    }
    std::vector<int> offs;
    switch (t) {
        case GGMLType::Q4_1:
        case GGMLType::Q5_1:
        case GGMLType::Q4_K:
        case GGMLType::Q5_K: offs = {0, 2}; break;
        case GGMLType::Q6_K: offs = {208}; break;
        default: offs = {0}; break;
    }
    std::uniform_real_distribution<float> sd(0.002f, 0.05f);
    for (int64_t b = 0; b < n_blocks; ++b)
        for (int o : offs) {
            const uint16_t h = __half_as_ushort(__float2half(sd(rng)));
            std::memcpy(&w[size_t(b) * bi.block_bytes + o], &h, 2);
        }
    return w;
}

// Median of `reps` timings of `fn` run `inner` times, in seconds per run; `sync` waits for its work.
double time_it(const std::function<void()>& sync, const std::function<void()>& fn, int inner = 20, int reps = 7) {
    fn();
    sync();
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        const auto a = std::chrono::steady_clock::now();
        for (int i = 0; i < inner; ++i) fn();
        sync();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / inner);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}
double time_it(Backend& be, const std::function<void()>& fn, int inner = 20, int reps = 7) {
    return time_it([&] { be.synchronize(); }, fn, inner, reps);
}

struct Named {
    GGMLType t;
    const char* name;
};

// kCopies device copies of one random weight (one pass over them does not fit in L2, so matmuls
// on rotating copies stream from HBM), random activations of up to max_tok tokens and an output.
struct MatmulBuffers {
    static constexpr int kCopies = 8;
    Backend& be;
    std::vector<Weight> ws;
    float* x = nullptr;
    float* y = nullptr;
    int rot = 0;
    MatmulBuffers(Backend& b, GGMLType t, int64_t n_in, int64_t n_out, int max_tok) : be(b) {
        std::vector<uint8_t> host = random_weight(t, n_out, n_in);
        GGUFTensor gt{"w", t, {n_in, n_out}, 0, host.size(), host.data()};
        for (int c = 0; c < kCopies; ++c) ws.push_back(be.prepare_weight(gt));
        std::vector<float> xh(size_t(max_tok) * n_in);
        std::normal_distribution<float> nd(0.f, 1.f);
        for (auto& v : xh) v = nd(rng);
        x = static_cast<float*>(be.alloc(xh.size() * 4));
        y = static_cast<float*>(be.alloc(size_t(max_tok) * n_out * 4));
        be.copy_from_host(x, xh.data(), xh.size() * 4);
    }
    ~MatmulBuffers() {
        be.free(x);
        be.free(y);
        for (Weight& w : ws) be.free(const_cast<void*>(w.data));
    }
    const Weight& next() { return ws[rot = (rot + 1) % kCopies]; }
};

} // namespace

int main(int argc, char** argv) {
    try {
        const BackendOptions opts; // its switches: the backend's, and the paths the tables below name
        const Switches& sw = opts.switches;
        auto be = make_cuda_backend(opts);
        // Copy bandwidth (bytes read + written) of a 1 GiB device-to-device copy.
        const size_t cb = size_t(1) << 30;
        void* a = be->alloc(cb);
        void* b = be->alloc(cb);
        cudaMemset(a, 1, cb);
        const double tc = time_it(
            *be,
            [&] {
                cudaMemcpy(b, a, cb, cudaMemcpyDeviceToDevice);
                cudaDeviceSynchronize(); // a device-to-device cudaMemcpy does not wait
            },
            5, 5);
        const double copy_bw = 2.0 * cb / tc;
        be->free(a);
        be->free(b);
        std::printf("device copy bandwidth: %.0f GB/s (read + write)\n\n", copy_bw / 1e9);
        // "gemv", "gemm", "gemm_kq", "gemm_dq" or "attention": that table alone
        const std::string only = argc > 1 ? argv[1] : "";
        auto wants = [&](const char* table) { return only.empty() || only == table; };

        const Named types[] = {
            {GGMLType::Q4_0, "Q4_0"},       {GGMLType::Q4_1, "Q4_1"},       {GGMLType::Q5_0, "Q5_0"},
            {GGMLType::Q5_1, "Q5_1"},       {GGMLType::Q8_0, "Q8_0"},       {GGMLType::Q4_K, "Q4_K"},
            {GGMLType::Q5_K, "Q5_K"},       {GGMLType::Q6_K, "Q6_K"},       {GGMLType::F16, "F16"},
            {GGMLType::BF16, "BF16"},       {GGMLType::F32, "F32"},         {GGMLType::MXFP4, "MXFP4"},
            {GGMLType::IQ4_NL, "IQ4_NL"},   {GGMLType::IQ4_XS, "IQ4_XS"},   {GGMLType::IQ3_S, "IQ3_S"},
            {GGMLType::IQ3_XXS, "IQ3_XXS"}, {GGMLType::IQ2_XXS, "IQ2_XXS"}, {GGMLType::IQ2_XS, "IQ2_XS"},
            {GGMLType::IQ2_S, "IQ2_S"},     {GGMLType::IQ1_S, "IQ1_S"},     {GGMLType::IQ1_M, "IQ1_M"},
            {GGMLType::TQ1_0, "TQ1_0"},     {GGMLType::TQ2_0, "TQ2_0"},     {GGMLType::NVFP4, "NVFP4"},
            {GGMLType::Q2_K, "Q2_K"},       {GGMLType::Q3_K, "Q3_K"}};
        // llama2-7b shapes: (n_in, n_out) of q/k/v/o, gate/up, down.
        const int64_t shapes[3][2] = {{4096, 4096}, {4096, 11008}, {11008, 4096}};
        if (wants("gemv"))
            std::printf(
                "| type | shape | tok | us (with q8 of x) | GB/s from HBM | %% of copy bw | pp512 TFLOP/s |\n"
                "|---|---|---|---|---|---|---|\n");
        for (const Named& ty : types) {
            if (!wants("gemv")) break;
            for (auto& sh : shapes) {
                int64_t n_in = sh[0], n_out = sh[1];
                if (cuda::block_info(ty.t).block_elems == 256 && n_in % 256) n_in = 11264;
                MatmulBuffers m(*be, ty.t, n_in, n_out, 512);
                const double wbytes = double(cuda::packed_layout(ty.t, n_in, n_out).total);
                const double t1 = time_it(*be, [&] { be->matmul(m.next(), m.x, 1, m.y); }, 48);
                const double tg = time_it(*be, [&] { be->matmul(m.ws[0], m.x, 512, m.y); }, 5);
                std::printf("| %s | %lldx%lld | 1 | %.1f | %.0f | %.0f%% | %.0f |\n", ty.name, (long long)n_out,
                            (long long)n_in, t1 * 1e6, wbytes / t1 / 1e9, 100.0 * wbytes / t1 / (copy_bw / 2),
                            2.0 * 512 * n_in * n_out / tg / 1e12);
            }
        }

        // Batched decode (continuous batching): matmuls of 16..256 tokens through Backend::matmul for
        // gemm_dq's formats, the weight's bytes (one pass) over the time, against the H100's
        // 3.35 TB/s HBM3 peak: the path project() picks (gemm_dq, gemm_q8, dequantize + cuBLAS).
        // EMBER_CUDA_GEMM_DQ=0 times the older paths, with EMBER_CUDA_GEMM_Q8=0 too the GEMV in
        // chunks of 8 tokens. Then (table "gemm_dq") gemm_dq launched directly at every batch size
        // (with the f16 conversion of x; "kernel us": the GEMM alone), to set its dispatch bounds.
        constexpr double kHbmPeak = 3.35e12;
        // The path each batch takes and the form of the direct gemm_dq launches: the backend's kernel
        // choice on this GPU and build, under the same switches (EMBER_CUDA_GEMM_DQ / _GEMM_Q8 /
        // _GEMM_DQ_WGMMA), the row tile EMBER_CUDA_GEMM_DQ_ROWS's.
        const cuda::KernelSwitches ksw = cuda::kernel_switches(sw);
        const cuda::DeviceCaps dev{cuda::device_cc(), cuda::gemm_dq_wgmma_built()};
        auto choice = [&](GGMLType type, int64_t n_in, int32_t n_tok, bool force_dq) {
            cuda::MatmulQuery q;
            q.type = type;
            q.n_in = n_in;
            q.batch.n_tok = n_tok;
            q.sw = ksw;
            q.sw.gemm_dq = q.sw.gemm_dq || force_dq;
            q.dev = dev;
            return cuda::choose_matmul(q);
        };
        const cuda::GemmDqForm dq_form{choice(GGMLType::Q4_0, 4096, 64, true) == cuda::MatmulKernel::gemm_dq_wgmma,
                                       int(sw.integer("EMBER_CUDA_GEMM_DQ_ROWS"))};
        const Named dq_types[] = {{GGMLType::Q4_0, "Q4_0"}, {GGMLType::Q8_0, "Q8_0"}, {GGMLType::Q4_1, "Q4_1"}};
        if (wants("gemm"))
            std::printf(
                "\n| path | type | shape | tok | us (with conversion of x) | weight GB/s | %% of 3.35 TB/s | TOPS |\n"
                "|---|---|---|---|---|---|---|---|\n");
        for (const Named& ty : dq_types) {
            if (!wants("gemm")) break;
            for (auto& sh : shapes) {
                const int64_t n_in = sh[0], n_out = sh[1];
                MatmulBuffers m(*be, ty.t, n_in, n_out, 256);
                const double wbytes = double(cuda::packed_layout(ty.t, n_in, n_out).total);
                for (int n_tok : {16, 32, 64, 128, 192, 256}) {
                    const double tm = time_it(*be, [&] { be->matmul(m.next(), m.x, n_tok, m.y); }, 20);
                    const char* path = cuda::matmul_kernel_name(choice(ty.t, n_in, n_tok, false));
                    std::printf("| %s | %s | %lldx%lld | %d | %.1f | %.0f | %.0f%% | %.0f |\n", path, ty.name,
                                (long long)n_out, (long long)n_in, n_tok, tm * 1e6, wbytes / tm / 1e9,
                                100.0 * wbytes / tm / kHbmPeak, 2.0 * n_tok * n_in * n_out / tm / 1e12);
                }
            }
        }
        // K-quant batched decode (table "gemm_kq"): Q4_K and Q6_K matmuls of 16-64 tokens through
        // Backend::matmul on Llama-3-8B's q / o and gate / up shapes, by the path the switches give them:
        // the GEMV in chunks of 8 tokens by default, gemm_dq under EMBER_CUDA_GEMM_KQ=1 (run the table
        // under both).
        if (wants("gemm_kq"))
            std::printf(
                "\n| path | type | shape | tok | us (with conversion of x) | weight GB/s | %% of 3.35 TB/s | TOPS |\n"
                "|---|---|---|---|---|---|---|---|\n");
        const Named kq_types[] = {{GGMLType::Q4_K, "Q4_K"}, {GGMLType::Q6_K, "Q6_K"}};
        const int64_t kq_shapes[2][2] = {{4096, 4096}, {4096, 14336}};
        for (const Named& ty : kq_types) {
            for (auto& sh : kq_shapes) {
                if (!wants("gemm_kq")) break;
                const int64_t n_in = sh[0], n_out = sh[1];
                MatmulBuffers m(*be, ty.t, n_in, n_out, 64);
                const double wbytes = double(cuda::packed_layout(ty.t, n_in, n_out).total);
                for (int n_tok : {16, 32, 64}) {
                    const double tm = time_it(*be, [&] { be->matmul(m.next(), m.x, n_tok, m.y); }, 20);
                    const char* path = cuda::matmul_kernel_name(choice(ty.t, n_in, n_tok, false));
                    std::printf("| %s | %s | %lldx%lld | %d | %.1f | %.0f | %.0f%% | %.0f |\n", path, ty.name,
                                (long long)n_out, (long long)n_in, n_tok, tm * 1e6, wbytes / tm / 1e9,
                                100.0 * wbytes / tm / kHbmPeak, 2.0 * n_tok * n_in * n_out / tm / 1e12);
                }
            }
        }
        if (wants("gemm_dq"))
            std::printf(
                "\n| gemm_dq | shape | tok | us (with f16 of x) | kernel us | weight GB/s (kernel) | %% of 3.35 TB/s | TOPS |\n"
                "|---|---|---|---|---|---|---|---|\n");
        cudaStream_t cs = nullptr;
        if (wants("gemm_dq")) cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
        auto sync_cs = [&] { cudaStreamSynchronize(cs); };
        // Each llama2-7b weight alone, then the engine's fused launches of a layer (Q, K, V: 3 x
        // 4096x4096; gate and up: 2 x 11008x4096), whose row tiles share one grid. (n_in, n_out,
        // weights a launch); the single weights come first, in `shapes` order (Nsight Compute's
        // --launch-skip counts of a profile of this table count on it).
        const int64_t dq_launches[5][3] = {
            {4096, 4096, 1}, {4096, 11008, 1}, {11008, 4096, 1}, {4096, 4096, 3}, {4096, 11008, 2}};
        for (const Named& ty : dq_types) {
            if (!wants("gemm_dq")) break;
            for (auto& dl : dq_launches) {
                const int64_t n_in = dl[0], n_out = dl[1];
                const int count = int(dl[2]);
                MatmulBuffers m(*be, ty.t, n_in, n_out, 256);
                auto* xh = static_cast<__half*>(be->alloc(size_t(256) * n_in * 2));
                std::vector<float*> ys{m.y};
                while (int(ys.size()) < count) ys.push_back(static_cast<float*>(be->alloc(size_t(256) * n_out * 4)));
                be->synchronize(); // x uploaded before the first launch on cs
                const cuda::PackedLayout layout = cuda::packed_layout(ty.t, n_in, n_out);
                const double wbytes = double(layout.total) * count;
                cuda::DeviceWeight dws[cuda::kMaxGemmDqWeights];
                const cuda::DeviceWeight* wp[cuda::kMaxGemmDqWeights];
                auto launch = [&](int n_tok) { // the next copies of the weight (not in L2)
                    for (int i = 0; i < count; ++i) {
                        dws[i] = {ty.t, static_cast<const uint8_t*>(m.next().data), layout, n_in, n_out};
                        wp[i] = &dws[i];
                    }
                    cuda::gemm_dq(wp, ys.data(), count, xh, n_tok, dq_form, cs);
                };
                const std::string shape = (count > 1 ? std::to_string(count) + "x " : std::string()) +
                                          std::to_string(n_out) + "x" + std::to_string(n_in);
                for (int n_tok : {9, 16, 32, 48, 64, 96, 128, 192, 256}) {
                    const double tf = time_it(sync_cs, [&] {
                        cuda::gemm_dq_input(m.x, xh, n_tok, n_in, cs);
                        launch(n_tok);
                    });
                    const double tk = time_it(sync_cs, [&] { launch(n_tok); });
                    std::printf("| %s | %s | %d | %.1f | %.1f | %.0f | %.0f%% | %.0f |\n", ty.name, shape.c_str(),
                                n_tok, tf * 1e6, tk * 1e6, wbytes / tk / 1e9, 100.0 * wbytes / tk / kHbmPeak,
                                2.0 * count * n_tok * n_in * n_out / tk / 1e12);
                }
                for (size_t i = 1; i < ys.size(); ++i) be->free(ys[i]);
                be->free(xh);
            }
        }
        if (cs) cudaStreamDestroy(cs);

        // Paged attention: llama2-7b heads (32 x 128, no GQA), one decode token at depth (up to 512:
        // the reference-order kernel), and a 512-token prompt.
        if (wants("attention"))
            std::printf("\n| attention | ctx | us | GB/s of K/V | TFLOP/s |\n|---|---|---|---|---|\n");
        const int n_head = 32, n_kv = 32, hd = 128, bs = 16;
        for (int ctx : {128, 256, 384, 512, 4096, 16384}) {
            if (!wants("attention")) break;
            const int n_blocks = ctx / bs;
            KVLayer kv;
            kv.n_blocks = n_blocks;
            kv.block_size = bs;
            kv.n_head_kv = n_kv;
            kv.head_dim = hd;
            const size_t kvb = size_t(ctx) * n_kv * hd * 2;
            kv.k = be->alloc(kvb);
            kv.v = be->alloc(kvb);
            std::vector<__half> kvh(kvb / 2);
            std::normal_distribution<float> nd(0.f, 1.f);
            for (auto& v : kvh) v = __float2half(nd(rng));
            be->copy_from_host(kv.k, kvh.data(), kvb);
            be->copy_from_host(kv.v, kvh.data(), kvb);
            std::vector<int32_t> table(n_blocks);
            for (int i = 0; i < n_blocks; ++i) table[i] = (i * 7919) % n_blocks;
            const int n_q = 512;
            std::vector<float> qh(size_t(n_q) * n_head * hd);
            for (auto& v : qh) v = nd(rng);
            float* q = static_cast<float*>(be->alloc(qh.size() * 4));
            float* o = static_cast<float*>(be->alloc(qh.size() * 4));
            be->copy_from_host(q, qh.data(), qh.size() * 4);
            const AttentionShape shape{n_head, n_kv, hd, 0.08838834764f};
            BatchInfo bi;
            bi.n_tok = 1;
            bi.pos = {ctx - 1};
            bi.seq = {0};
            bi.n_seq = 1;
            bi.max_blocks = n_blocks;
            bi.block_table = table;
            be->set_batch(bi);
            const double td = time_it(*be, [&] { be->attention(kv, q, 1, shape, o); }, 50);
            std::printf("| decode 1 tok | %d | %.1f | %.0f | - |\n", ctx, td * 1e6, 2.0 * kvb / td / 1e9);
            if (ctx == 512) {
                bi.n_tok = n_q;
                bi.pos.resize(n_q);
                bi.seq.assign(n_q, 0);
                for (int i = 0; i < n_q; ++i) bi.pos[i] = i;
                be->set_batch(bi);
                const double tp = time_it(*be, [&] { be->attention(kv, q, n_q, shape, o); }, 5);
                const double flops = 4.0 * n_head * hd * (double(n_q) * (n_q + 1) / 2);
                std::printf("| prompt 512 tok | %d | %.1f | - | %.2f |\n", ctx, tp * 1e6, flops / tp / 1e12);
            }
            be->free(q);
            be->free(o);
            be->free(kv.k);
            be->free(kv.v);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ember-cuda-bench: %s\n", e.what());
        return 1;
    }
    (void)argv;
    return 0;
}
