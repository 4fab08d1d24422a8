// Launcher of the grouped RMS norm (rmsnorm_grouped.cu), Backend::rmsnorm_grouped on the GPU.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ember {
namespace cuda {

// As Backend::rmsnorm_grouped: x, gamma and y in device memory; y may be x.
void rmsnorm_grouped(const float* x, const float* gamma, int32_t n_rows, int64_t width, int32_t n_groups, float eps,
                     float* y, cudaStream_t s);

}  // namespace cuda
}  // namespace ember
