// CudaWeightStream: two device staging sets for a block's weights, filled on a copy stream of
// their own. Copies read the model mapping directly once it is pinned (cudaHostRegister, read
// only); where the system refuses that, host threads fill pinned bounce buffers whose copies
// overlap the next fill. Quantized blocks are copied raw and re-laid out on the GPU.
#include "weight_stream.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "weight_pack.h"

namespace ember {
namespace cuda {

namespace {

constexpr size_t kBounceBytes = size_t(8) << 20;   // per bounce buffer
constexpr int kBounceBufs = 4;                      // one filling while the others copy
constexpr int64_t kFillGrain = int64_t(256) << 10;  // bytes per host thread hand-out
constexpr double kMiB = 1024.0 * 1024.0;

size_t align256(size_t n) { return (n + 255) & ~size_t(255); }
// One matrix's ggml bytes (an expert's, for a stacked weight).
size_t raw_bytes(const Weight& w) {
    const TypeTraits& b = block_info(w.type);
    return size_t(w.n_in / b.block_elems) * size_t(w.n_out) * size_t(b.block_bytes);
}

class CudaWeightStream final : public WeightStream {
public:
    CudaWeightStream(int device, cudaStream_t compute, std::function<void()> flush, const StreamSetup& su, bool pin)
        : device_(device), compute_(compute), flush_(std::move(flush)), blocks_(su.blocks),
          parallel_for_(su.parallel_for) {
        try {
            open(su.verbose, pin);
        } catch (...) {
            close();
            throw;
        }
    }
    ~CudaWeightStream() override { close(); }

    std::vector<Weight> upload(int set, int layer) override {
        if (set < 0 || set > 1 || layer < 0 || layer >= int(blocks_.size()) || blocks_[layer].empty())
            fail("cuda weight stream: no staged block ", layer, " (set ", set, ")");
        EMBER_CUDA_CHECK(cudaStreamWaitEvent(copy_, free_[set], 0));
        std::vector<Weight> out;
        size_t off = 0;
        for (const Weight& h : blocks_[layer]) {
            // A stacked expert weight goes expert by expert, each at the device stride prepare_weight uses.
            const PackedLayout L = packed_layout(h.type, h.n_in, h.n_out);
            const int32_t n_exp = std::max(h.n_expert, 1);
            for (int32_t e = 0; e < n_exp; ++e) {
                uint8_t* dst = set_[set] + off + size_t(e) * align256(L.total);
                const uint8_t* src = static_cast<const uint8_t*>(h.data) + size_t(e) * h.expert_stride;
                if (L.qs_bytes == 0) {
                    to_device(dst, src, L.total);
                } else {   // the raw buffer is reused in copy-stream order
                    to_device(raw_, src, raw_bytes(h));
                    pack_weight_device(h.type, h.n_in, h.n_out, raw_, dst, copy_);
                }
            }
            Weight d = h;
            d.data = set_[set] + off;
            d.expert_stride = n_exp > 1 ? align256(L.total) : 0;
            out.push_back(d);
            off += align256(L.total) * size_t(n_exp);
        }
        EMBER_CUDA_CHECK(cudaEventRecord(ready_[set], copy_));
        return out;
    }
    void acquire(int set) override {
        flush_();
        EMBER_CUDA_CHECK(cudaStreamWaitEvent(compute_, ready_[set], 0));
    }
    void release(int set) override {
        flush_();
        EMBER_CUDA_CHECK(cudaEventRecord(free_[set], compute_));
    }
    void copy_to_host_async(void* host, const void* dev, size_t bytes) override {
        flush_();
        EMBER_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, compute_));
    }
    void* alloc_host(size_t bytes) override {
        void* p = nullptr;
        if (cudaMallocHost(&p, bytes) != cudaSuccess) {
            cudaGetLastError();
            return nullptr;
        }
        host_allocs_.push_back(p);
        return p;
    }

private:
    void open(bool verbose, bool pin_mapping) {
        EMBER_CUDA_CHECK(cudaSetDevice(device_));
        size_t set_bytes = 0, raw_max = 0;
        const uint8_t *lo = nullptr, *hi = nullptr;
        int n_streamed = 0;
        for (const std::vector<Weight>& ws : blocks_) {
            size_t total = 0;
            for (const Weight& w : ws) {
                const PackedLayout L = packed_layout(w.type, w.n_in, w.n_out);   // throws for unsupported types
                const size_t raw = raw_bytes(w), n_exp = size_t(std::max(w.n_expert, 1));
                if (w.src && raw * n_exp > w.src->nbytes)
                    fail("cuda: tensor ", w.src->name, " holds ", w.src->nbytes, " bytes, its shape needs ",
                         raw * n_exp);
                total += align256(L.total) * n_exp;
                if (L.qs_bytes) raw_max = std::max(raw_max, raw);
                const uint8_t* p = static_cast<const uint8_t*>(w.data);
                lo = lo ? std::min(lo, p) : p;
                hi = std::max(hi, p + (n_exp - 1) * w.expert_stride + raw);
            }
            set_bytes = std::max(set_bytes, total);
            n_streamed += !ws.empty();
        }
        if (n_streamed == 0) fail("cuda weight stream: no block to stream");
        for (uint8_t*& s : set_) s = device_alloc(set_bytes);
        if (raw_max) raw_ = device_alloc(raw_max);
        EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
        for (int i = 0; i < 2; ++i) {
            EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&ready_[i], cudaEventDisableTiming));
            EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&free_[i], cudaEventDisableTiming));
        }
        const std::string how = pin_mapping ? pin(lo, hi) : "copies through pinned bounce buffers (EMBER_STREAM_PIN=0)";
        if (!pinned_) {
            for (int i = 0; i < kBounceBufs; ++i) {
                EMBER_CUDA_CHECK(cudaMallocHost(&bounce_[i], kBounceBytes));
                EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&bounce_done_[i], cudaEventDisableTiming));
            }
        }
        if (verbose)
            std::fprintf(stderr, "ember: %d CPU blocks stream to GPU %d for prompt batches: 2 x %.0f MiB staging, %s\n",
                         n_streamed, device_, set_bytes / kMiB, how.c_str());
    }

    uint8_t* device_alloc(size_t bytes) {
        void* p = nullptr;
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            throw OutOfMemory(cat("cuda: weight streaming needs ", bytes / kMiB, " MiB more, ", free_b / kMiB,
                                  " MiB free on GPU ", device_));
        }
        return static_cast<uint8_t*>(p);
    }

    // Pins the mapped range [lo, hi) (whole pages) for direct copies; says how copies will go.
    std::string pin(const uint8_t* lo, const uint8_t* hi) {
        const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
        const uintptr_t a = uintptr_t(lo) / page * page, b = (uintptr_t(hi) + page - 1) / page * page;
        int read_only = 0;
        cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, device_);
        void* p = reinterpret_cast<void*>(a);
        const cudaError_t e = cudaHostRegister(p, b - a,
                                               read_only ? cudaHostRegisterReadOnly : cudaHostRegisterDefault);
        if (e == cudaSuccess || e == cudaErrorHostMemoryAlreadyRegistered) {
            cudaGetLastError();
            pinned_ = true;
            if (e == cudaSuccess) registered_ = p;   // another context's registration stays its own
            return cat("copies straight from the pinned mapping (", (b - a) / kMiB, " MiB)");
        }
        cudaGetLastError();
        return cat("copies through pinned bounce buffers (pinning the mapping failed: ", cudaGetErrorString(e), ")");
    }

    // Host -> device on the copy stream.
    void to_device(uint8_t* dst, const uint8_t* src, size_t bytes) {
        if (pinned_) {
            EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_));
            return;
        }
        for (size_t off = 0; off < bytes; off += kBounceBytes) {
            const size_t len = std::min(kBounceBytes, bytes - off);
            const int k = next_bounce_;
            next_bounce_ = (k + 1) % kBounceBufs;
            EMBER_CUDA_CHECK(cudaEventSynchronize(bounce_done_[k]));   // its last copy has read it
            uint8_t* buf = static_cast<uint8_t*>(bounce_[k]);
            const uint8_t* from = src + off;
            parallel_for_(int64_t(len), kFillGrain,
                          [&](int64_t b, int64_t e) { std::memcpy(buf + b, from + b, size_t(e - b)); });
            EMBER_CUDA_CHECK(cudaMemcpyAsync(dst + off, buf, len, cudaMemcpyHostToDevice, copy_));
            EMBER_CUDA_CHECK(cudaEventRecord(bounce_done_[k], copy_));
        }
    }

    // Frees whatever open() got (also after a failed open); errors are ignored on the way out.
    void close() {
        cudaSetDevice(device_);
        cudaStreamSynchronize(compute_);
        if (copy_) cudaStreamSynchronize(copy_);
        if (registered_) cudaHostUnregister(registered_);
        for (uint8_t* s : set_) cudaFree(s);
        cudaFree(raw_);
        for (int i = 0; i < kBounceBufs; ++i) {
            if (bounce_[i]) cudaFreeHost(bounce_[i]);
            if (bounce_done_[i]) cudaEventDestroy(bounce_done_[i]);
        }
        for (void* p : host_allocs_) cudaFreeHost(p);
        for (int i = 0; i < 2; ++i) {
            if (ready_[i]) cudaEventDestroy(ready_[i]);
            if (free_[i]) cudaEventDestroy(free_[i]);
        }
        if (copy_) cudaStreamDestroy(copy_);
        cudaGetLastError();
    }

    int device_;
    cudaStream_t compute_;
    std::function<void()> flush_;
    std::vector<std::vector<Weight>> blocks_;   // host weights per layer
    HostParallelFor parallel_for_;
    cudaStream_t copy_ = nullptr;
    uint8_t* set_[2] = {nullptr, nullptr};
    uint8_t* raw_ = nullptr;                    // raw blocks of one quantized weight before re-layout
    cudaEvent_t ready_[2] = {}, free_[2] = {};
    bool pinned_ = false;
    void* registered_ = nullptr;                // the range this stream registered
    void* bounce_[kBounceBufs] = {};
    cudaEvent_t bounce_done_[kBounceBufs] = {};
    int next_bounce_ = 0;
    std::vector<void*> host_allocs_;
};

}  // namespace

std::unique_ptr<WeightStream> open_weight_stream(int device, cudaStream_t compute, std::function<void()> flush,
                                                 const StreamSetup& setup, bool pin) {
    return std::make_unique<CudaWeightStream>(device, compute, std::move(flush), setup, pin);
}

}  // namespace cuda
}  // namespace ember
