// Device helpers shared by the sm90 chunk kernels (kernel.cuh and its roles, inverse.cuh):
// swizzled 16-bit tiles, the fused l2norm of q and k rows, the 64 x 64 unit-lower-triangular
// inverse.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/mma_sync.cuh"
#include "ptx/sync.cuh"
#include "ptx/wgmma.cuh"

namespace dsv4 {

// Byte offset of element (row, col) in a [rows][64] 16-bit tile with the 128-byte swizzle.
__device__ __forceinline__ uint32_t sw128_offset(int row, int col) {
  return row * 128 + ((((col >> 3) ^ row) & 7) << 4) + ((col & 7) << 1);
}

// T_u in HBM, per (chunk, v-head): only its ten lower 16 x 16 blocks (the six upper ones are
// zero), block (r, c), c <= r, at r (r + 1) / 2 + c, each row-major with 16-element rows. 5 KB
// instead of 8 for the full 64 x 64 tile, written by the inverse kernel and read by the main
// kernel's prep with one bulk copy.
struct PackedTu {
  static constexpr int kBlocks = 10;
  static constexpr int kElems = kBlocks * 16 * 16;
  // Element offset of (row, col), col <= row (a lower block).
  __device__ __forceinline__ static int offset(int row, int col) {
    const int r = row >> 4, c = col >> 4;
    return ((r * (r + 1) / 2 + c) * 16 + (row & 15)) * 16 + (col & 15);
  }
  // First (row, col) of the 16-byte piece u in [0, kElems / 8): 8 elements of one block row.
  __device__ __forceinline__ static void piece(int u, int& row, int& col) {
    const int block = u >> 5, r = block >= 6 ? 3 : block >= 3 ? 2 : block >= 1 ? 1 : 0;
    const int c = block - r * (r + 1) / 2;
    row = 16 * r + ((u >> 1) & 15);
    col = 16 * c + 8 * (u & 1);
  }
};

// Plain shared-memory stores into a swizzled tile (the compiler may batch them; a later
// fence.proxy.async and barrier publish them to wgmma).
template <typename T>
__device__ __forceinline__ void store_at(void* tile, uint32_t byte_offset, T value) {
  *reinterpret_cast<T*>(static_cast<uint8_t*>(tile) + byte_offset) = value;
}

template <typename T>
__device__ __forceinline__ T load_at(const void* tile, uint32_t byte_offset) {
  return *reinterpret_cast<const T*>(static_cast<const uint8_t*>(tile) + byte_offset);
}

// C (16 x 16) += X (16 x 16) * Y (16 x 16), fp16 in shared memory with row strides ldx, ldy (in
// elements; each row 16-byte aligned); fp32 accumulation. c[n] holds the 16 x 8 block n.
__device__ __forceinline__ void mma_16x16x16_f16(float (&c)[2][4], const __half* x, int ldx,
                                                 const __half* y, int ldy, int lane) {
  // ldmatrix: lane l addresses row l % 8 of 8 x 8 matrix l / 8. X's matrices in A-fragment
  // order (rows 0-7 / 8-15, then columns 8-15); Y's as (k 0-7 / 8-15) x (n 0-7, then 8-15).
  const int r = (lane & 7) + ((lane >> 3) & 1) * 8, c8 = (lane >> 4) * 8;
  uint32_t a[4], b[4];
  ptx::ldmatrix_x4(a, ptx::smem_addr(x + r * ldx + c8));
  ptx::ldmatrix_x4_trans(b, ptx::smem_addr(y + r * ldy + c8));
  ptx::mma_f16_m16n8k16(c[0], a, {b[0], b[1]});
  ptx::mma_f16_m16n8k16(c[1], a, {b[2], b[3]});
}

// Writes s * C (the 16 x 16 mma_16x16x16_f16 accumulator) to fp16 shared memory, row stride ld.
__device__ __forceinline__ void store_16x16(const float (&c)[2][4], float s, __half* dst, int ld,
                                            int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    *reinterpret_cast<__half2*>(&dst[g * ld + 8 * nt + 2 * t]) =
        __floats2half2_rn(s * c[nt][0], s * c[nt][1]);
    *reinterpret_cast<__half2*>(&dst[(g + 8) * ld + 8 * nt + 2 * t]) =
        __floats2half2_rn(s * c[nt][2], s * c[nt][3]);
  }
}

// use_qk_l2norm_in_kernel: row `row` of a [2][64][64] swizzled q or k tile (one token's 128
// key dims) becomes x / sqrt(sum x^2 + 1e-6), rounded to the 16-bit type as
// flash-linear-attention's l2norm does before its chunk kernels.
template <typename Element>
__device__ __forceinline__ void l2norm_rows_in_place(Element* tile, int row) {
  constexpr int kHalf = 64 * 64;  // elements per K half
  float sum_sq = 0.f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int part = 0; part < 8; ++part) {
      const uint4 raw = *reinterpret_cast<const uint4*>(
          reinterpret_cast<const uint8_t*>(tile + half * kHalf) + sw128_offset(row, 8 * part));
      const Element* x = reinterpret_cast<const Element*>(&raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_sq = fmaf(ptx::to_float(x[e]), ptx::to_float(x[e]), sum_sq);
    }
  }
  const float inv_norm = rsqrtf(sum_sq + 1e-6f);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int part = 0; part < 8; ++part) {
      uint8_t* at = reinterpret_cast<uint8_t*>(tile + half * kHalf) + sw128_offset(row, 8 * part);
      const uint4 raw = *reinterpret_cast<const uint4*>(at);
      const Element* x = reinterpret_cast<const Element*>(&raw);
      uint32_t w[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        w[e] = ptx::pack2<Element>(ptx::to_float(x[2 * e]) * inv_norm,
                                   ptx::to_float(x[2 * e + 1]) * inv_norm);
      }
      *reinterpret_cast<uint4*>(at) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// acc = K K^T (token x token) of a chunk's [2][64][64] k tile (both K halves, 128-byte swizzle,
// as TMA writes it) by one warpgroup's wgmma, landed: the delta rule's inverse needs it.
template <typename Element>
__device__ __forceinline__ void k_times_k_transposed(float (&acc)[32], uint32_t k_tile) {
  ptx::wgmma_fence();
#pragma unroll
  for (int cb = 0; cb < 2; ++cb) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t dk = ptx::smem_desc_sw128(k_tile + cb * 64 * 128 + kk * 32, 0, 1024);
      ptx::WgmmaSS<64, Element>::run(acc, dk, dk, (cb | kk) != 0);
    }
  }
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) ptx::fence_operand(acc[i]);
}

// A = beta_i k_i.k_j from K K^T's accumulator fragment (rows frag_row and frag_row + 8, columns
// 8 j + frag_col and the next) into an fp16 tile of row stride kLd. The inverse reads only the
// strict lower triangle, so a warp (16 rows) stores only the column blocks up to its diagonal
// block's. Rows past the sequence (zero-filled, or the next sequence's) are selected away,
// never scaled.
template <int kLd>
__device__ __forceinline__ void store_beta_kkt(const float (&acc)[32], const float* beta,
                                               int valid_rows, __half (*a)[kLd], int frag_row,
                                               int frag_col) {
  const int last_j = 2 * (frag_row / 16) + 1;  // warp-uniform
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = frag_row + 8 * i;
    const float b = beta[row];
    const bool in = row < valid_rows;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j > last_j) break;
      *reinterpret_cast<__half2*>(&a[row][8 * j + frag_col]) = __floats2half2_rn(
          in ? b * acc[4 * j + 2 * i] : 0.f, in ? b * acc[4 * j + 2 * i + 1] : 0.f);
    }
  }
}

// T = (I + A)^-1 for the strictly lower part of a 64 x 64 A in shared memory (row stride kLd;
// its diagonal and upper triangle are never read), by one warpgroup (warp 0-3, lane); A is
// overwritten, T lands in `t`: its upper blocks are not written, and its diagonal blocks'
// upper triangles are exact zeros. A, T and the E blocks are kept in fp16: its 10-bit mantissa
// is tf32's, and with unit keys and beta <= 1 every entry is at most 1 in magnitude
// (benchmarks/inverse_precision.py: the error of T matches an fp32 workspace's; bf16 is up to
// 7x worse). Products accumulate in fp32. 16 x 16 blocks (D_a = T_aa):
//   T_ab = sum_{m=b}^{a-1} E_am T_mb,  E_am = -D_a A_am  (a > b),
// evaluated by distance a - b so the four warps work side by side. `sync` is a barrier over the
// warpgroup's 128 threads; `idle` runs on warps 2 and 3 during step 1 (work of the caller's
// that touches neither a nor t).
template <int kLd, typename Sync, typename Idle>
__device__ __forceinline__ void invert_unit_lower_64(__half (*a)[kLd], __half (*t)[kLd], int warp,
                                                     int lane, Sync sync, Idle idle) {
  // 1. D_w, the diagonal 16 x 16 blocks, by warps 0 and 1, two each (issue-bound work: a second
  //    pair of warps would only add instructions):
  //    a. each quarter-warp inverts one 8 x 8 diagonal block by forward substitution in fp32,
  //       lane c owning column c (row loads are broadcasts per quarter-warp);
  //    b. D_w = [[T1, 0], [-(T2 A21) T1, T2]], for both of the warp's blocks at once by two
  //       m16n8k16 MMAs whose A operand is block-diagonal (the halves' products side by side).
  //    Half the substitution's chain and a third of its instructions against 16 x 16 blocks,
  //    at the same error (benchmarks/inverse_precision.py, "fp16 d8").
  if (warp < 2) {
    const int b8 = (4 * warp + lane / 8) * 8, c = lane % 8;
    float col[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint4 raw = *reinterpret_cast<const uint4*>(&a[b8 + i][b8]);
      const __half* h = reinterpret_cast<const __half*>(&raw);
      float acc = i == c ? 1.f : 0.f;
#pragma unroll
      for (int j = 0; j < i; ++j) acc = fmaf(-__half2float(h[j]), col[j], acc);
      col[i] = acc;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) t[b8 + i][b8 + c] = __float2half_rn(col[i]);
    __syncwarp();
    // The warp's blocks start at o0 and o1. One ldmatrix.trans gives the B operands: A21 of
    // both blocks (for Z = T2 A21), then T1 of both (for Z T1); lane l addresses row l % 8 of
    // matrix l / 8.
    const int o0 = 32 * warp, o1 = o0 + 16, g = lane / 4, q = 2 * (lane % 4);
    const int m = lane / 8, o = m % 2 ? o1 : o0;
    const __half* row = m < 2 ? &a[o + 8 + lane % 8][o] : &t[o + lane % 8][o];
    uint32_t b[4];
    ptx::ldmatrix_x4_trans(b, ptx::smem_addr(row));
    uint32_t x[4] = {*reinterpret_cast<const uint32_t*>(&t[o0 + 8 + g][o0 + 8 + q]), 0u, 0u,
                     *reinterpret_cast<const uint32_t*>(&t[o1 + 8 + g][o1 + 8 + q])};
    float z[4] = {};
    ptx::mma_f16_m16n8k16(z, x, {b[0], b[1]});
    x[0] = ptx::pack2<__half>(z[0], z[1]);
    x[3] = ptx::pack2<__half>(z[2], z[3]);
    float y[4] = {};
    ptx::mma_f16_m16n8k16(y, x, {b[2], b[3]});
    *reinterpret_cast<__half2*>(&t[o0 + 8 + g][o0 + q]) = __floats2half2_rn(-y[0], -y[1]);
    *reinterpret_cast<__half2*>(&t[o1 + 8 + g][o1 + q]) = __floats2half2_rn(-y[2], -y[3]);
    *reinterpret_cast<__half2*>(&t[o0 + g][o0 + 8 + q]) = __float2half2_rn(0.f);
    *reinterpret_cast<__half2*>(&t[o1 + g][o1 + 8 + q]) = __float2half2_rn(0.f);
  } else {
    idle();
  }
  sync();
  auto blk_a = [&](int r, int c) { return &a[16 * r][16 * c]; };
  auto blk_t = [&](int r, int c) { return &t[16 * r][16 * c]; };
  // E_am = -D_a A_am, written over A_am (a warp reads its operands before it stores).
  auto make_e = [&](int r, int m) {
    float e[2][4] = {};
    mma_16x16x16_f16(e, blk_t(r, r), kLd, blk_a(r, m), kLd, lane);
    __syncwarp();
    store_16x16(e, -1.f, blk_a(r, m), kLd, lane);
    __syncwarp();
  };
  // 2. distance 1 (warps 0-2), and the E blocks distances 2-3 need (warp 3).
  if (warp < 3) {
    make_e(warp + 1, warp);
    float t1[2][4] = {};
    mma_16x16x16_f16(t1, blk_a(warp + 1, warp), kLd, blk_t(warp, warp), kLd, lane);
    store_16x16(t1, 1.f, blk_t(warp + 1, warp), kLd, lane);
  } else {
    make_e(2, 0);
    make_e(3, 1);
    make_e(3, 0);
  }
  sync();
  // 3. distance 2 (warps 0, 1); warp 2 starts T_30 = E_30 D_0 + E_31 T_10 (+ E_32 T_20).
  float t2[2][4] = {};
  if (warp < 3) {
    const int r = warp == 2 ? 3 : warp + 2, c = warp == 2 ? 0 : warp;
    mma_16x16x16_f16(t2, blk_a(r, c), kLd, blk_t(c, c), kLd, lane);
    mma_16x16x16_f16(t2, blk_a(r, c + 1), kLd, blk_t(c + 1, c), kLd, lane);
    if (warp < 2) store_16x16(t2, 1.f, blk_t(r, c), kLd, lane);
  }
  sync();
  // 4. distance 3.
  if (warp == 2) {
    mma_16x16x16_f16(t2, blk_a(3, 2), kLd, blk_t(2, 0), kLd, lane);
    store_16x16(t2, 1.f, blk_t(3, 0), kLd, lane);
  }
  sync();
}

}  // namespace dsv4
