// The chunk kernel's producer (warpgroup 0, warp 0): per chunk, TMA loads of q, k (both halves
// of K) and v as two 64-column tiles (none for a state map), for the delta rule a bulk copy of
// the chunk's packed ungated inverse T_u into the P tile (csrc/sm90/chunk/inverse.cuh, run
// before this kernel; kFused: odd chunks only), and cp.async of g and beta (zero past the chunk).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "sm90/chunk/tiles.cuh"
#include "sm90/chunk/traits.h"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"

namespace dsv4 {

// Before the walk: the descriptors prefetched, and t_u_chunk at the walk's first chunk slot of
// T_u (PackedTu; the delta rule).
template <typename Element, bool kDelta>
__device__ __forceinline__ void start_producer(const ChunkContext& ctx, const CUtensorMap& tmap_q,
                                               const CUtensorMap& tmap_k, const CUtensorMap& tmap_v,
                                               const Element*& t_u_chunk) {
  constexpr int kChunk = ChunkSm90Traits<Element>::kChunk;
  const ChunkSm90Params& p = ctx.p;
  if (ctx.lane == 0) {
    ptx::tma_prefetch_descriptor(&tmap_q);
    ptx::tma_prefetch_descriptor(&tmap_k);
    ptx::tma_prefetch_descriptor(&tmap_v);
  }
  if constexpr (kDelta) {
    const int64_t slot0 =
        p.sequences != nullptr
            ? p.chunk_start[ctx.n]
            : static_cast<int64_t>(ctx.tma_batch) * p.chunks_per_seq + ctx.tma_row0 / kChunk;
    t_u_chunk =
        static_cast<const Element*>(p.t_u) + (slot0 * p.heads_v + ctx.hv) * PackedTu::kElems;
  }
}

// The warp: chunk c's g and beta, zero-filled past the chunk, then its 32 cp.async arrivals.
template <typename Element, bool kDelta>
__device__ __forceinline__ void load_chunk_gates(const ChunkContext& ctx, const int& c,
                                                 const int& st, const uint32_t& full) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  auto& S = s.stage[st];
  const ChunkSm90Params& p = ctx.p;
  const int valid_rows = min(kChunk, ctx.len - c * kChunk);
#pragma unroll
  for (int i = ctx.lane; i < kChunk; i += 32) {
    const bool valid = i < valid_rows;
    const int64_t idx = valid ? (ctx.row_base + c * kChunk + i) * p.heads_v + ctx.hv : 0;
    ptx::cp_async_4_zfill(ptx::smem_addr(&S.g[i]), p.g + idx, valid);
    if constexpr (kDelta) ptx::cp_async_4_zfill(ptx::smem_addr(&S.beta[i]), p.beta + idx, valid);
  }
  ptx::cp_async_mbarrier_arrive_noinc(full);
}

// Chunk c into its stage once the stage is free; t_u_chunk moves on to the next chunk's slot.
template <typename Element, bool kDelta, bool kFused>
__device__ __forceinline__ void load_chunk(const ChunkContext& ctx, const int& c,
                                           const CUtensorMap& tmap_q, const CUtensorMap& tmap_k,
                                           const CUtensorMap& tmap_v, const Element*& t_u_chunk) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk, kStages = Tr::kStages;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  const int st = c % kStages;
  const uint32_t phase = (c / kStages) & 1;
  const uint32_t full = ptx::smem_addr(&s.full[st]);
  ptx::mbarrier_wait(ptx::smem_addr(&s.empty[st]), phase ^ 1);
  const int row = ctx.tma_row0 + c * kChunk;
  const bool load_t_u = kDelta && !(kFused && c % 2 == 0);
  if (ctx.lane == 0) {
    auto& S = s.stage[st];
    ptx::mbarrier_arrive_expect_tx(full, (load_t_u ? Tr::kLoadBytesDelta : Tr::kLoadBytes) -
                                             (ctx.state_map ? sizeof(S.v) : 0));
    for (int cb = 0; cb < 2; ++cb) {
      ptx::tma_load_4d(ptx::smem_addr(&S.q[cb][0][0]), &tmap_q, full, cb * 64, row, ctx.head_qk,
                       ctx.tma_batch);
      ptx::tma_load_4d(ptx::smem_addr(&S.k[cb][0][0]), &tmap_k, full, cb * 64, row, ctx.head_qk,
                       ctx.tma_batch);
    }
    if (!ctx.state_map) {
      for (int ch = 0; ch < Tr::kChains; ++ch) {
        ptx::tma_load_4d(ptx::smem_addr(&S.v[ch][0][0]), &tmap_v, full, ch * Tr::kBlockV, row,
                         ctx.hv, ctx.tma_batch);
      }
    }
    if (load_t_u) ptx::bulk_load(ptx::smem_addr(&S.p[0][0]), t_u_chunk, Tr::kTuBytes, full);
    if constexpr (kDelta) t_u_chunk += static_cast<int64_t>(ctx.p.heads_v) * PackedTu::kElems;
  }
  load_chunk_gates<Element, kDelta>(ctx, c, st, full);
}

}  // namespace dsv4
