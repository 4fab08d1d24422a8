// Tensor-core building blocks shared by the attention kernels and the quantized GEMM: mma.sync
// m16n8k16 (f16 in, f32 accumulate), m16n8k32 (s8 in, s32 accumulate) and ldmatrix loads of
// their fragments from shared memory (sm_80 and later).
// Fragment layouts (g = lane / 4, t = lane % 4): A 16x16 row-major a0 (g, 2t..2t+1),
// a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); B 16x8 b0 (2t..2t+1, g), b1 (2t+8.., g);
// C 16x8 c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1). The s8 shape has four bytes where f16 has
// two halves: A 16x32 a0 (g, 4t..4t+3), a1 (g+8, 4t..), a2 (g, 4t+16..), a3 (g+8, 4t+16..);
// B 32x8 b0 (4t..4t+3, g), b1 (4t+16.., g); C as above. An 8x16-byte ldmatrix matrix gives lane
// (g, t) bytes 4t..4t+3 of row g, so int8 fragments load with the b16 ldmatrix.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace ember {
namespace cuda {

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// An m16n8 accumulator's four values (c0, c1: row r, columns k and k + 1; c2, c3: row r + 8)
// into a [column][row] float tile whose columns are `stride` floats apart.
__device__ __forceinline__ void store_acc_transposed(float* tile, int stride, int r, int k, const float (&c)[4]) {
    tile[k * stride + r] = c[0];
    tile[(k + 1) * stride + r] = c[1];
    tile[k * stride + r + 8] = c[2];
    tile[(k + 1) * stride + r + 8] = c[3];
}

// c += a . b with int8 operands; the int32 sums are exact.
__device__ __forceinline__ void mma16832_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    const unsigned addr = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
    const unsigned addr = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
    const unsigned addr = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

}  // namespace cuda
}  // namespace ember
