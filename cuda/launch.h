// Kernel launches of the decode path with programmatic dependent launch (Hopper): a kernel may
// be scheduled while the previous one drains, and waits (pdl_wait) before touching memory, so
// the launch gap between the many small kernels of a step overlaps the previous kernel's tail.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda_check.h"

namespace ember {
namespace cuda {

// Set by the backend when it is made, for devices that support it (compute capability >= 9.0)
// unless EMBER_CUDA_PDL=0.
bool& pdl_enabled();

// The current device's compute capability, major * 10 + minor (90: Hopper, the only one that runs
// sm_90a code).
int device_cc();
// The current device is Hopper or newer: thread-block clusters, tensor copies, PDL.
bool device_is_sm90();

// cluster_x > 1: the grid's x dimension runs in thread-block clusters of that many CTAs (Hopper).
template <class... KArgs, class... Args>
void launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, unsigned cluster_x,
                        cudaStream_t s, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (pdl_enabled()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster_x;
        attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    EMBER_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <class... KArgs, class... Args>
void launch_pdl_smem(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
    launch_pdl_cluster(kernel, grid, block, smem, 1, s, std::forward<Args>(args)...);
}

template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t s, Args&&... args) {
    launch_pdl_smem(kernel, grid, block, 0, s, std::forward<Args>(args)...);
}

}  // namespace cuda
}  // namespace ember
