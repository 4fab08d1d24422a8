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

}  // namespace cuda
}  // namespace ember
