// The store of new K and V rows into a float-typed paged cache (f16, bf16, f32): one block per token; the
// rows [kv_dim] go to slot pos % block_size of physical block block_table[seq][pos / block_size], layout
// [n_blocks][block_size][kv_dim], each value converted by Convert. Either cache may be null.
#pragma once
#include "common.cuh"
#include "kernels.h"

namespace ember {
namespace cuda {

template <class T, class Convert>
__global__ void kv_store_rows_kernel(T* __restrict__ kc, T* __restrict__ vc, int32_t block_size, int32_t kv_dim,
                                     const float* __restrict__ k, const float* __restrict__ v, DeviceBatch b) {
    pdl_wait();
    pdl_trigger();
    const Convert to;
    const int t = blockIdx.x;
    const int p = b.pos[t];
    const int64_t phys = b.block_table[int64_t(b.seq[t]) * b.max_blocks + p / block_size];
    const int64_t dst = (phys * block_size + p % block_size) * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        if (kc) kc[dst + i] = to(k[int64_t(t) * kv_dim + i]);
        if (vc) vc[dst + i] = to(v[int64_t(t) * kv_dim + i]);
    }
}

}  // namespace cuda
}  // namespace ember
