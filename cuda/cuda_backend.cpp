// The CUDA backend's device and lifetime: the device queries launch.h declares, the CUDA error
// path, the backend's constructor (its switches read once, from BackendOptions) and destructor, and
// the factory the registry calls.
#include "cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "cuda_backend_impl.h"
#include "cuda_check.h"
#include "launch.h"

namespace ember {

namespace cuda {

bool& pdl_enabled() {
    static bool on = false;
    return on;
}

int device_cc() {
    // Launch paths ask at every launch: the attributes are read once per device (0: not yet known).
    static std::atomic<int> known[64];
    int dev = 0;
    EMBER_CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<int>* slot = dev < 64 ? &known[dev] : nullptr;
    if (const int k = slot ? slot->load(std::memory_order_relaxed) : 0) return k;
    int major = 0, minor = 0;
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    const int cc = 10 * major + minor;
    if (slot) slot->store(cc, std::memory_order_relaxed);
    return cc;
}

bool device_is_sm90() { return device_cc() >= 90; }

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
    cudaGetLastError();   // clear a sticky launch error so the next call starts clean
    const std::string msg = cat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", what,
                                " at ", file, ":", line);
    if (err == cudaErrorMemoryAllocation) throw OutOfMemory(msg);
    throw std::runtime_error(msg);
}

// The switches (src/backend/switches.cpp says what each does) are read here once, from the
// snapshot the backend was made with; the kernel choices take them in every query.
CudaBackend::CudaBackend(const BackendOptions& opts)
    : device_(opts.device), sw_(kernel_switches(opts.switches)),
      gemm_dq_rows_(int(opts.switches.integer("EMBER_CUDA_GEMM_DQ_ROWS"))),
      stream_pin_(opts.switches.on("EMBER_STREAM_PIN")) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        fail("cuda: no CUDA device is present (", cudaGetErrorString(e), ")");
    }
    if (device_ < 0 || device_ >= n) fail("cuda: device ", device_, " does not exist (", n, " present)");
    EMBER_CUDA_CHECK(cudaSetDevice(device_));
    dev_.cc = device_cc();
    dev_.sm90a_build = gemm_dq_wgmma_built();
    pdl_enabled() = device_is_sm90() && sw_.pdl;
    EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_, cudaEventDisableTiming));
    EMBER_CUBLAS_CHECK(cublasCreate(&cublas_));
    EMBER_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // A fixed workspace keeps cuBLAS from allocating inside a captured graph.
    cublas_ws_ = alloc(kCublasWorkspace);
    EMBER_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, kCublasWorkspace));
}

CudaBackend::~CudaBackend() {
    cudaSetDevice(device_);
    if (capturing_) abort_capture();
    cudaStreamSynchronize(stream_);
    for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
    if (cublas_) cublasDestroy(cublas_);
    for (void* p : owned_) cudaFree(p);
    for (Scratch* s : {&xq_, &xds_, &xh_, &wh_, &batch_dev_, &part_acc_, &part_ml_, &split_ctr_, &kv_f16_})
        cudaFree(s->p);
    cudaFree(cublas_ws_);
    if (staging_) cudaFreeHost(staging_);
    for (const HostBlock& h : host_blocks_) cudaFreeHost(h.p);   // (pinned_in_ and pinned_out_ among them)
    cudaEventDestroy(staging_done_);
    cudaStreamDestroy(stream_);
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
    return std::make_unique<cuda::CudaBackend>(opts);
}

}  // namespace ember
