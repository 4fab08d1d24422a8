// The CUDA backend's memory: device and pinned host allocations, copies (small host-to-device
// copies wait as pending uploads issued by the next op), weight and vector upload, scratch buffers,
// and the batch mirror (positions, sequence ids, attention tiles, block table) set_batch writes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda_backend_impl.h"
#include "cuda_check.h"
#include "weight_pack.h"
#include "weight_stream.h"

namespace ember {
namespace cuda {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

float bf16_bits_to_float(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace

size_t CudaBackend::free_memory() {
    EMBER_CUDA_CHECK(cudaSetDevice(device_));
    size_t free_b = 0, total_b = 0;
    EMBER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
}

void* CudaBackend::alloc(size_t bytes) {
    EMBER_CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        throw OutOfMemory(cat("cuda: needed ", bytes / kMiB, " MiB, free ", free_b / kMiB, " MiB of ", total_b / kMiB,
                              " MiB on GPU ", device_));
    }
    // A new buffer may replace one a recorded graph writes to (the caller's key cannot tell).
    invalidate_graphs();
    return p;
}

void CudaBackend::free(void* p) {
    issue_uploads();   // (a pending upload may write p)
    if (p) EMBER_CUDA_CHECK(cudaFree(p));
}

// Small copies wait in pinned memory as pending uploads (see issue_uploads); larger ones, and
// any from memory already pinned (host KV blocks: no bounce copy, no wait for room), go now.
void CudaBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
    if (void* p = is_pinned(src, bytes) ? nullptr : pinned_input(bytes)) {
        std::memcpy(p, src, bytes);
        add_upload(dst, p, bytes);
        return;
    }
    issue_uploads();
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
}

// Copies into memory from alloc_host land directly; other small copies (a decode step's logits)
// go through a pinned bounce buffer: from pageable memory the copy keeps the GPU idle while the
// host pages it in (docs/performance.md).
void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
    issue_uploads();
    const bool direct = bytes > kPinnedOutBytes || is_pinned(dst, bytes);
    if (!direct && !pinned_out_) pinned_out_ = alloc_host(kPinnedOutBytes);
    void* to = direct ? dst : pinned_out_;
    EMBER_CUDA_CHECK(cudaMemcpyAsync(to, src, bytes, cudaMemcpyDeviceToHost, stream_));
    host_waited_ = true;
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (to != dst) std::memcpy(dst, to, bytes);
}

// Into pinned memory the copy runs behind the ops; pageable memory takes the synchronous path.
void CudaBackend::copy_to_host_async(void* dst, const void* src, size_t bytes) {
    if (!is_pinned(dst, bytes)) {
        copy_to_host(dst, src, bytes);
        return;
    }
    issue_uploads();
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
    issue_uploads();
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::synchronize() {
    issue_uploads();
    host_waited_ = true;
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void* CudaBackend::alloc_host(size_t bytes) {
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        throw OutOfMemory(cat("cuda: could not pin ", bytes / kMiB, " MiB of host memory"));
    }
    host_blocks_.push_back(HostBlock{p, bytes});
    return p;
}

void CudaBackend::free_host(void* p) {
    issue_uploads();
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));   // no copy still writes it
    auto it = std::find_if(host_blocks_.begin(), host_blocks_.end(), [p](const HostBlock& h) { return h.p == p; });
    if (it == host_blocks_.end()) fail("cuda free_host: ", p, " did not come from alloc_host");
    host_blocks_.erase(it);
    EMBER_CUDA_CHECK(cudaFreeHost(p));
}

// A 3-D tensor [n_expert][n_out][n_in] holds a mixture's experts: each is packed as a matrix of its
// own, the experts at a fixed 256-byte-aligned stride in one allocation (Weight::expert_stride).
Weight CudaBackend::prepare_weight(const GGUFTensor& t) {
    if (t.ne.empty() || t.ne.size() > 3)
        fail("cuda: tensor ", t.name, " has ", t.ne.size(), " dimensions; weights have 1 to 3");
    Weight w;
    w.type = t.type;
    w.n_in = t.ne[0];
    w.n_out = t.ne.size() > 1 ? t.ne[1] : 1;
    w.n_expert = t.ne.size() > 2 ? int32_t(t.ne[2]) : 1;
    w.src = &t;
    if (w.n_in < 1 || w.n_out < 1 || w.n_expert < 1)
        fail("cuda: tensor ", t.name, " has an empty dimension (", w.n_in, " x ", w.n_out, " x ", w.n_expert, ")");
    const PackedLayout L = packed_layout(t.type, w.n_in, w.n_out);
    const size_t raw = size_t(L.n_blocks) * size_t(w.n_out) * size_t(block_info(t.type).block_bytes);
    if (raw * size_t(w.n_expert) > t.nbytes)
        fail("cuda: tensor ", t.name, " holds ", t.nbytes, " bytes, its shape needs ", raw * size_t(w.n_expert));
    w.expert_stride = w.n_expert > 1 ? (L.total + 255) / 256 * 256 : 0;
    const size_t bytes = w.n_expert > 1 ? w.expert_stride * size_t(w.n_expert) : L.total;
    void* d = alloc(bytes);
    owned_.push_back(d);
    if (L.qs_bytes == 0 && w.n_expert == 1) {
        copy_to_device_now(d, t.data, L.total, stream_);
    } else {
        std::vector<uint8_t> packed(bytes);
        for (int32_t e = 0; e < w.n_expert; ++e) {
            const uint8_t* src = t.data + size_t(e) * raw;
            uint8_t* dst = packed.data() + size_t(e) * w.expert_stride;
            if (L.qs_bytes == 0) std::memcpy(dst, src, L.total);
            else pack_weight(t.type, w.n_in, w.n_out, src, dst);
        }
        copy_to_device_now(d, packed.data(), bytes, stream_);
    }
    w.data = d;
    return w;
}

const float* CudaBackend::prepare_vector(const GGUFTensor& t) {
    int64_t n = 1;
    for (int64_t v : t.ne) n *= v;
    std::vector<float> host(size_t(std::max<int64_t>(n, 0)));
    const uint16_t* h16 = reinterpret_cast<const uint16_t*>(t.data);
    switch (t.type) {
        case GGMLType::F32:
            if (t.nbytes < size_t(n) * 4) fail("cuda: vector ", t.name, " is truncated");
            std::memcpy(host.data(), t.data, size_t(n) * 4);
            break;
        case GGMLType::F16:
            if (t.nbytes < size_t(n) * 2) fail("cuda: vector ", t.name, " is truncated");
            for (int64_t i = 0; i < n; ++i) host[i] = __half2float(__ushort_as_half(h16[i]));
            break;
        case GGMLType::BF16:
            if (t.nbytes < size_t(n) * 2) fail("cuda: vector ", t.name, " is truncated");
            for (int64_t i = 0; i < n; ++i) host[i] = bf16_bits_to_float(h16[i]);
            break;
        default: fail("cuda: vector ", t.name, " must be F32, F16 or BF16, got type ", uint32_t(t.type));
    }
    void* d = alloc(host.size() * 4);
    owned_.push_back(d);
    copy_to_device_now(d, host.data(), host.size() * 4, stream_);
    return static_cast<const float*>(d);
}

// Positions, sequence ids, block table and attention tiles go to one fixed device buffer through a
// pinned staging copy; offsets depend only on capacities, so a captured graph stays valid while
// the contents change.
void CudaBackend::set_batch(const BatchInfo& b) {
    issue_uploads();   // (the previous batch's upload reads the staging rewritten below)
    const int32_t n_tok = b.n_tok;
    if (n_tok < 0 || int64_t(b.pos.size()) < n_tok || int64_t(b.seq.size()) < n_tok)
        fail("cuda set_batch: n_tok ", n_tok, " but ", b.pos.size(), " positions and ", b.seq.size(), " sequence ids");
    if (int64_t(b.block_table.size()) < int64_t(b.n_seq) * b.max_blocks)
        fail("cuda set_batch: block table holds ", b.block_table.size(), " entries, need ", b.n_seq, " x ",
             b.max_blocks);
    int32_t max_pos = -1;
    for (int32_t t = 0; t < n_tok; ++t) {
        if (b.seq[t] < 0 || b.seq[t] >= b.n_seq)
            fail("cuda set_batch: token ", t, " has sequence ", b.seq[t], " of ", b.n_seq);
        if (b.pos[t] < 0) fail("cuda set_batch: token ", t, " has negative position ", b.pos[t]);
        max_pos = std::max(max_pos, b.pos[t]);
    }
    if (ropes_.reserve(max_pos + 1, stream_)) invalidate_graphs();
    // Capacities grow (never shrink); growing reallocates and invalidates recorded graphs.
    // The block table keeps a fixed row stride so a sequence growing by a block does not
    // change any kernel parameter.
    if (n_tok > cap_tok_ || b.n_seq > cap_seq_ || b.max_blocks > bt_stride_) {
        cap_tok_ = std::max(cap_tok_, pow2_ceil(std::max(n_tok, 8)));
        cap_seq_ = std::max(cap_seq_, pow2_ceil(std::max(b.n_seq, 1)));
        bt_stride_ = std::max(bt_stride_, pow2_ceil(std::max(b.max_blocks, 64)));
        invalidate_graphs();
    }
    // int32 layout: pos[cap_tok] seq[cap_tok] tiles[kNumTileLens][cap_tok][2] block_table[cap_seq][bt_stride]
    const size_t n_words = size_t(cap_tok_) * kBatchHeadWords + size_t(cap_seq_) * size_t(bt_stride_);
    ensure(batch_dev_, n_words * 4);
    if (staging_cap_ < n_words * 4) {
        EMBER_CUDA_CHECK(cudaEventSynchronize(staging_done_));
        if (staging_) EMBER_CUDA_CHECK(cudaFreeHost(staging_));
        staging_ = nullptr;
        EMBER_CUDA_CHECK(cudaMallocHost(&staging_, n_words * 4));
        staging_cap_ = n_words * 4;
        invalidate_graphs();   // recorded steps copy from the old staging
    }
    EMBER_CUDA_CHECK(cudaEventSynchronize(staging_done_));   // the previous step's copies have read it
    in_used_ = 0;
    int32_t* w = static_cast<int32_t*>(staging_);
    std::copy(b.pos.begin(), b.pos.begin() + n_tok, w);
    std::copy(b.seq.begin(), b.seq.begin() + n_tok, w + cap_tok_);
    for (int k = 0; k < kNumTileLens; ++k) {
        int32_t* tiles = w + 2 * cap_tok_ + size_t(k) * 2 * cap_tok_;
        int n = 0;
        for (int32_t t = 0; t < n_tok;) {
            int32_t e = t + 1;
            while (e < n_tok && e - t < kTileLens[k] && b.seq[e] == b.seq[t]) ++e;
            tiles[2 * n] = t;
            tiles[2 * n + 1] = e - t;
            ++n;
            t = e;
        }
        n_tiles_[k] = n;
    }
    int32_t* bt = w + kBatchHeadWords * size_t(cap_tok_);
    for (int32_t q = 0; q < b.n_seq; ++q)
        std::copy(b.block_table.begin() + int64_t(q) * b.max_blocks,
                  b.block_table.begin() + int64_t(q + 1) * b.max_blocks, bt + int64_t(q) * bt_stride_);
    add_upload(batch_dev_.p, staging_, n_words * 4);
    const int32_t* d = static_cast<const int32_t*>(batch_dev_.p);
    dbatch_.pos = d;
    dbatch_.seq = d + cap_tok_;
    dbatch_.block_table = d + kBatchHeadWords * size_t(cap_tok_);
    dbatch_.max_blocks = bt_stride_;
    n_tok_ = n_tok;
    n_seq_ = b.n_seq;
    max_len_ = max_pos + 1;
    invariant_ = b.batch_invariant;
    fast_attn_ = b.fast_attention;
    uint64_t sig = mix(mix(uint64_t(n_tok), uint64_t(invariant_)), uint64_t(fast_attn_));
    for (int k = 0; k < kNumTileLens; ++k) sig = mix(sig, uint64_t(n_tiles_[k]));
    sig = mix(sig, uint64_t(attention_want_splits(max_len_, 0)));
    batch_sig_ = sig;
}

std::unique_ptr<WeightStream> CudaBackend::open_stream(const StreamSetup& setup) {
    issue_uploads();
    return open_weight_stream(device_, stream_, [this] { issue_uploads(); }, setup, stream_pin_);
}

// Pending uploads: host-to-device copies of a step's inputs from pinned staging (the batch mirror,
// copy_from_host's small copies), issued by the next op or inside a step's capture. A replayed step
// then costs the host one graph launch, not two more copy calls and an event record. staging_done_
// follows the last issued ones: set_batch waits on it before rewriting the staging.
void CudaBackend::issue_uploads() {
    if (!uploads_.n) return;
    copy_from_pinned(uploads_, stream_);
    if (!capturing_) EMBER_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
    uploads_.n = 0;
}

void CudaBackend::add_upload(void* dst, const void* src, size_t bytes) {
    uploads_.dst[uploads_.n] = dst;
    uploads_.src[uploads_.n] = src;
    uploads_.bytes[uploads_.n++] = bytes;
}

// Room in pinned_in_ for a pending upload of `bytes`; null (copy directly) when it does not fit,
// while capturing, or when the upload list is full.
void* CudaBackend::pinned_input(size_t bytes) {
    constexpr size_t kAlign = 256;
    if (bytes > kPinnedInBytes || capturing_ || uploads_.n == kMaxHostCopies) return nullptr;
    if (in_used_ + bytes > kPinnedInBytes) {   // full: wait until the issued copies have read it
        issue_uploads();
        EMBER_CUDA_CHECK(cudaEventSynchronize(staging_done_));
        in_used_ = 0;
    }
    if (!pinned_in_) pinned_in_ = alloc_host(kPinnedInBytes);
    void* p = static_cast<char*>(pinned_in_) + in_used_;
    in_used_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return p;
}

bool CudaBackend::is_pinned(const void* p, size_t bytes) const {
    const char* c = static_cast<const char*>(p);
    for (const HostBlock& h : host_blocks_)
        if (c >= static_cast<const char*>(h.p) && c + bytes <= static_cast<const char*>(h.p) + h.bytes) return true;
    return false;
}

// Grows s to hold bytes; true when it (re)allocated.
bool CudaBackend::ensure(Scratch& s, size_t bytes) {
    if (bytes <= s.cap) return false;
    if (capturing_) fail("cuda: scratch buffer must grow to ", bytes, " bytes inside a captured step");
    if (s.p) {
        EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
        EMBER_CUDA_CHECK(cudaFree(s.p));
        s.p = nullptr;
        s.cap = 0;
    }
    const size_t cap = std::max(bytes, s.cap * 3 / 2);
    s.p = alloc(cap);
    s.cap = cap;
    invalidate_graphs();
    return true;
}

// The q8_1 activation buffers (xq_, xds_), grown to hold `total` values.
CudaBackend::Q8 CudaBackend::q8_scratch(int64_t total) {
    ensure(xq_, size_t(total));
    ensure(xds_, size_t(total / 32) * sizeof(float2));
    return {static_cast<int8_t*>(xq_.p), static_cast<float2*>(xds_.p)};
}

// xh_ sized for n values: where a kernel writes gemm_dq's f16 input for project(x_dq).
__half* CudaBackend::dq_scratch(int64_t n) {
    ensure(xh_, size_t(n) * 2);
    return static_cast<__half*>(xh_.p);
}

}  // namespace cuda
}  // namespace ember
