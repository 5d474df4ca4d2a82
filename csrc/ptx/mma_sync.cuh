// Warp-level mma.sync (PTX ISA 9.7.14), for products too small for a warpgroup wgmma.
#pragma once

#include <cstdint>

namespace dsv4::ptx {

// D (16x8 fp32) += A (16x16 fp16, row) * B (16x8 fp16, col). With g = lane / 4, t = lane % 4,
// each register two fp16 values, the lower column (A) or row (B) in the low half:
//   a = {A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]},  b = {B[2t..][g], B[2t+8..][g]},
//   d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}.
__device__ __forceinline__ void mma_f16_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8 x 8 16-bit matrices from shared memory: lane l gives the address of row l % 8 of
// matrix l / 8 (16 bytes); r[j] is this lane's pair of matrix j, row lane / 4, columns
// 2 (lane % 4) and the next. The .trans form gives the pair at rows 2 (lane % 4) and the next,
// column lane / 4.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");  // reads what plain stores of other lanes wrote
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");  // reads what plain stores of other lanes wrote
}

// Four 8 x 8 16-bit matrices to shared memory, each transposed: r[j] is this lane's pair of
// matrix j (row lane / 4, columns 2 (lane % 4) and the next, as ldmatrix gives them), and lane
// l gives the address of stored row l % 8 of matrix l / 8 (16 bytes): matrix column l % 8.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
               :
               : "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

}  // namespace dsv4::ptx
