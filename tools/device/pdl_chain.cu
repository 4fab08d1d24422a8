// The floor of one kernel boundary in a decode step: a CUDA graph of N tiny dependent kernels
// (each reads the previous kernel's value and writes its own), replayed, timed per kernel. With
// programmatic dependent launch (as the decode kernels run) and without, for a few grid sizes.
// Build and run on the device (from the repository root):
//   nvcc -O3 -arch=sm_90a -Icuda -Isrc -Iinclude -o /tmp/pdl_chain tools/device/pdl_chain.cu && /tmp/pdl_chain
#include <cuda_runtime.h>

#include <cstdio>

#include "common.cuh"

#define CHECK(x)                                                \
    do {                                                        \
        cudaError_t e = (x);                                    \
        if (e != cudaSuccess) {                                 \
            std::printf("%s: %s\n", #x, cudaGetErrorString(e)); \
            return 1;                                           \
        }                                                       \
    } while (0)

// As the decode kernels: trigger the next kernel, wait for the previous one (both return at once
// in a launch without the PDL attribute).
__global__ void step_kernel(const int* in, int* out) {
    ember::cuda::pdl_trigger();
    ember::cuda::pdl_wait();
    if (threadIdx.x == 0) out[blockIdx.x] = in[blockIdx.x] + 1;
}

int main() {
    constexpr int kChain = 256, kReps = 20;
    int* buf;
    CHECK(cudaMalloc(&buf, 2 * 4096 * sizeof(int)));
    CHECK(cudaMemset(buf, 0, 2 * 4096 * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::printf("| CTAs | PDL | us a kernel |\n|---|---|---|\n");
    for (int ctas : {1, 32, 132, 1024, 3072}) {
        for (int pdl = 0; pdl < 2; ++pdl) {
            cudaGraph_t g;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < kChain; ++i) {
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(ctas);
                cfg.blockDim = dim3(128);
                cfg.stream = s;
                cudaLaunchAttribute attr[1];
                attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = attr;
                cfg.numAttrs = pdl ? 1 : 0;
                const int* in = buf + (i % 2) * 4096;
                int* out = buf + ((i + 1) % 2) * 4096;
                CHECK(cudaLaunchKernelEx(&cfg, step_kernel, in, out));
            }
            CHECK(cudaStreamEndCapture(s, &g));
            cudaGraphExec_t ge;
            CHECK(cudaGraphInstantiate(&ge, g, 0));
            CHECK(cudaGraphLaunch(ge, s));
            cudaEvent_t a, b;
            cudaEventCreate(&a);
            cudaEventCreate(&b);
            CHECK(cudaEventRecord(a, s));
            for (int r = 0; r < kReps; ++r) CHECK(cudaGraphLaunch(ge, s));
            CHECK(cudaEventRecord(b, s));
            CHECK(cudaEventSynchronize(b));
            float ms = 0;
            cudaEventElapsedTime(&ms, a, b);
            std::printf("| %d | %s | %.2f |\n", ctas, pdl ? "yes" : "no", 1000.f * ms / (kReps * kChain));
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
        }
    }
    return 0;
}
