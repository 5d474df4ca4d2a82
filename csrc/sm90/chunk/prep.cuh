// The chunk kernel's prep warpgroup (warpgroup 1): everything that does not depend on S, up to
// two chunks ahead of the chains:
//   G = cumsum(g) (log2 units), P = (Q K^T) . Gamma . [i >= j]  and, for the delta rule,
//   T = (I + strict_lower(beta_i Gamma_ij k_i.k_j))^-1 = Gamma . T_u into the T tile, then P
//   over T_u (a barrier between them: T_u lands in the P tile).
// With use_qk_l2norm_in_kernel it first normalizes the stage's q and k rows in place, before
// anyone else reads them (the chain waits for prep_full). kFused, an even chunk: the prep first
// solves T_u itself (K K^T by wgmma, invert_unit_lower_64) into the stage's t and p tiles, and
// the producer loads none. Gamma_ij = exp(G_i - G_j) is computed pairwise, only where selected.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "sm90/chunk/tiles.cuh"
#include "sm90/chunk/traits.h"
#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/wgmma.cuh"

namespace dsv4 {

// One chunk of the prep's walk: what its steps read besides the context.
struct PrepChunk {
  int c;
  bool write_p;  // P feeds only o's products
  // The fragment's row and column, opaque with kFused so that the offsets derived from them
  // are computed per chunk: hoisted, they outlive the fused inverse's registers and spill.
  int row, col;
  int st;
  uint32_t phase;
};

// use_qk_l2norm_in_kernel: thread tid normalizes q row tid (tid < 64) or k row tid - 64 of the
// stage in place, before anyone else reads them (the chain waits for prep_full).
template <typename Element>
__device__ __forceinline__ void normalize_qk_rows(const ChunkContext& ctx, const PrepChunk& k) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  auto& S = s.stage[k.st];
  l2norm_rows_in_place<Element>(ctx.tid < kChunk ? &S.q[0][0][0] : &S.k[0][0][0],
                                ptx::opaque(ctx.tid % kChunk));  // offsets not hoisted
  ptx::fence_proxy_async_smem();  // the normalized q and k are read by wgmma
  named_barrier_sync(ChunkBarrier::kPrep);
}

// P_raw = Q K^T (token x token), issued (an empty group where no P is written).
template <typename Element>
__device__ __forceinline__ void issue_q_k_transposed(const PrepChunk& k, float (&pacc)[32]) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  auto& S = s.stage[k.st];
  const uint32_t q_base = ptx::smem_addr(&S.q[0][0][0]);
  const uint32_t k_base = ptx::smem_addr(&S.k[0][0][0]);
  ptx::wgmma_fence();
  if (k.write_p) {
#pragma unroll
    for (int cb = 0; cb < 2; ++cb) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t off = cb * kChunk * 128 + kk * 32;
        const uint64_t dk = ptx::smem_desc_sw128(k_base + off, 0, 1024);
        ptx::WgmmaSS<64, Element>::run(pacc, ptx::smem_desc_sw128(q_base + off, 0, 1024), dk,
                                       (cb | kk) != 0);
      }
    }
  }
  ptx::wgmma_commit();
}

// By warp 0: G, the inclusive prefix sum of the gates over the chunk in log2 units, e^G, and
// w = e^(G_last - G).
template <typename Element>
__device__ __forceinline__ void gate_cumsum(const ChunkContext& ctx, const PrepChunk& k) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr float kLog2e = 1.4426950408889634f;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  auto& S = s.stage[k.st];
  const int lane = ctx.lane;
  const float g0 = S.g[2 * lane], g1 = S.g[2 * lane + 1];
  float incl = g0 + g1;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const float up = __shfl_up_sync(0xffffffff, incl, d);
    if (lane >= d) incl += up;
  }
  const float g_last = __shfl_sync(0xffffffff, incl, 31) * kLog2e;
  const float ga = (incl - g1) * kLog2e, gb = incl * kLog2e;
  S.g2[2 * lane] = ga;
  S.g2[2 * lane + 1] = gb;
  S.eg[2 * lane] = ptx::exp2_approx(ga);
  S.eg[2 * lane + 1] = ptx::exp2_approx(gb);
  S.w[2 * lane] = ptx::exp2_approx(g_last - ga);
  S.w[2 * lane + 1] = ptx::exp2_approx(g_last - gb);
}

// This thread's T_u pairs (delta rule), all loaded before any is used (a load per pair under
// its own condition kept the gating pass one dependent chain, 2,700-3,200 cycles per chunk).
// From the packed tile, an upper block's pair lands on entries of another block, and
// the gating pass's select drops it. Pair (i, j) sits at a constant distance from pair (0, 0):
// block column j / 2 (256 elements per block), row 8 i, column 8 (j % 2).
template <typename Element, bool kDelta, bool kFused>
__device__ __forceinline__ void load_t_u_pairs(
    const PrepChunk& k, const __half (*fused_t_u)[ChunkSm90Traits<Element>::kInvLd],
    uint32_t (&t_u_pairs)[2][8]) {
  using Tr = ChunkSm90Traits<Element>;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  auto& S = s.stage[k.st];
  if (kFused && k.c % 2 == 0) {  // solved here
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        t_u_pairs[i][j] = load_at<uint32_t>(&fused_t_u[k.row + 8 * i][8 * j + k.col], 0);
      }
    }
    // Every prep thread has its T_u: T and P may overwrite the tiles under it.
    named_barrier_sync(ChunkBarrier::kPrep);
  } else if constexpr (kDelta) {
    const uint8_t* t_u_at = reinterpret_cast<const uint8_t*>(&S.p[0][0]) +
                            2 * ptx::opaque(PackedTu::offset(k.row, k.col));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        t_u_pairs[i][j] = load_at<uint32_t>(t_u_at, 2 * (256 * (j / 2) + 128 * i + 8 * (j % 2)));
      }
    }
  }
}

// Chunk c: G, P into the P tile and, for the delta rule, T into the T tile; then the stage is
// handed to the chains (prep_full) and released by this warpgroup (empty). The fused solve and
// the gating pass stay in this body: as functions of their own they reach ptxas as other code.
template <typename Element, bool kDelta, bool kFused>
__device__ __forceinline__ void prep_chunk(const ChunkContext& ctx, const int& c,
                                           float (&pacc)[32]) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk, kStages = Tr::kStages;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  const PrepChunk k{c,
                    ctx.p.o != nullptr && c >= ctx.warm,
                    kFused ? ptx::opaque(ctx.frag_row) : ctx.frag_row,
                    kFused ? ptx::opaque(ctx.frag_col) : ctx.frag_col,
                    c % kStages,
                    static_cast<uint32_t>((c / kStages) & 1)};
  auto& S = s.stage[k.st];
  ptx::mbarrier_wait(ptx::smem_addr(&s.full[k.st]), k.phase);
  if constexpr (kDelta) {
    if (ctx.p.qk_l2norm) normalize_qk_rows<Element>(ctx, k);
  }
  // kFused, an even chunk: T_u = (I + strict_lower(beta_i k_i.k_j))^-1 over the chunk's valid
  // rows, in fp16 (row stride kInvLd) over the stage's t and p tiles (the gating pass reads it,
  // then overwrites it).
  auto* const fused_t_u = reinterpret_cast<__half(*)[Tr::kInvLd]>(&S.t[0][0]);
  const bool solve_here = kFused && c % 2 == 0;
  if (solve_here) {
    float kacc[32];
    k_times_k_transposed<Element>(kacc, ptx::smem_addr(&S.k[0][0][0]));
    store_beta_kkt<Tr::kInvLd>(kacc, S.beta, min(kChunk, ctx.len - c * kChunk), s.inv_a, k.row,
                               k.col);
    // A written; the previous chunk's gating pass has read its stage's T_u long before.
    named_barrier_sync(ChunkBarrier::kPrep);
    // warp and lane opaque too: addresses hoisted out of the chunk loop would spill.
    invert_unit_lower_64<Tr::kInvLd>(
        s.inv_a, fused_t_u, ptx::opaque(ctx.warp), ptx::opaque(ctx.lane),
        [] { named_barrier_sync(ChunkBarrier::kPrep); }, [] {});
  }

  issue_q_k_transposed<Element>(k, pacc);
  if (ctx.warp == 0) gate_cumsum<Element>(ctx, k);
  named_barrier_sync(ChunkBarrier::kPrep);
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) ptx::fence_operand(pacc[i]);

  float g_col[16];  // G of this thread's 16 columns
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 g2v = *reinterpret_cast<const float2*>(&S.g2[8 * j + k.col]);
    g_col[2 * j] = g2v.x;
    g_col[2 * j + 1] = g2v.y;
  }
  uint32_t t_u_pairs[2][8];
  load_t_u_pairs<Element, kDelta, kFused>(k, fused_t_u, t_u_pairs);
  // T = Gamma . T_u (delta rule) into the T tile, and P_raw . Gamma in registers, at the same
  // (row, col) pairs; then P into the P tile, where T_u landed, once every prep thread has
  // read its T_u. T rows of tokens past the sequence are zero (so is their beta).
  const float neg_inf = __int_as_float(0xff800000);
  const int valid_rows = min(kChunk, ctx.len - c * kChunk);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = k.row + 8 * i;
    const float gi = S.g2[row];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float gamma[2];
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int col = 8 * j + k.col + cc;
        // Selected before exp: the upper triangle never reaches the exponential.
        gamma[cc] = ptx::exp2_approx(row >= col ? gi - g_col[2 * j + cc] : neg_inf);
      }
      if (k.write_p) {
        pacc[4 * j + 2 * i] *= gamma[0];
        pacc[4 * j + 2 * i + 1] *= gamma[1];
      }
      if constexpr (kDelta) {
        const int col = 8 * j + k.col;
        const bool row_in = row < valid_rows;
        float t_u[2];
        if (solve_here) {
          const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&t_u_pairs[i][j]));
          t_u[0] = x.x;
          t_u[1] = x.y;
        } else {
          const Element* x = reinterpret_cast<const Element*>(&t_u_pairs[i][j]);
          t_u[0] = ptx::to_float(x[0]);
          t_u[1] = ptx::to_float(x[1]);
        }
        store_at(&S.t[0][0], sw128_offset(row, col),
                 ptx::pack2<Element>(row_in && row >= col ? gamma[0] * t_u[0] : 0.f,
                                     row_in && row >= col + 1 ? gamma[1] * t_u[1] : 0.f));
      }
    }
  }
  if (k.write_p) {
    if (kDelta && !solve_here) named_barrier_sync(ChunkBarrier::kPrep);  // T_u read
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        store_at(&S.p[0][0], sw128_offset(k.row + 8 * i, 8 * j + k.col),
                 ptx::pack2<Element>(pacc[4 * j + 2 * i], pacc[4 * j + 2 * i + 1]));
      }
    }
  }
  ptx::fence_proxy_async_smem();  // P and T are read by the chain's wgmmas
  named_barrier_sync(ChunkBarrier::kPrep);
  // Every thread releases its own writes and reads, so the handoff does not depend on
  // the named barrier's cumulativity (and compute-sanitizer racecheck can follow it).
  ptx::mbarrier_arrive(ptx::smem_addr(&s.prep_full[k.st]));
  ptx::mbarrier_arrive(ptx::smem_addr(&s.empty[k.st]));
}

}  // namespace dsv4
