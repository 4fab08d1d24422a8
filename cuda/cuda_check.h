// CUDA error checking for host code of the CUDA backend: failures become exceptions
// (OutOfMemory for allocation failures), never aborts.
#pragma once
#include <cuda_runtime.h>

#include "ember/status.h"

namespace ember {
namespace cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

#define EMBER_CUDA_CHECK(expr)                                                                     \
    do {                                                                                           \
        cudaError_t err_ = (expr);                                                                 \
        if (err_ != cudaSuccess) ::ember::cuda::throw_cuda_error(err_, #expr, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: launch-configuration errors show up here (no sync).
#define EMBER_CUDA_LAUNCHED(name) EMBER_CUDA_CHECK(cudaGetLastError())

// Host bytes (pageable) into device memory, landed when it returns. A plain cudaMemcpy returns
// once pageable bytes are staged, before the DMA has written them, and the backend's stream is
// non-blocking, so a kernel launched on it next could read the allocation before they arrive.
inline void copy_to_device_now(void* dst, const void* src, size_t bytes, cudaStream_t s) {
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace cuda
}  // namespace ember
