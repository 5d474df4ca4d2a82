// The lightning indexer's scores over vLLM's paged FP8 indexer cache (dsv4_indexer_topk_paged):
// for a block of a request's queries, every closed row's Σ_h w_h ReLU(scale q_h · k), written to
// the chunk's fp32 workspace as score.cuh writes it, for the same top-k kernel.
//
// Decode has a few queries per request and thousands of rows, so this kernel reads bytes, not
// FLOPs: one page (64 rows) is one key tile, loaded by TMA through a tensor map over the cache's
// blocks (the block id from the request's table) with its 256 scale bytes by a bulk copy, both
// onto the stage's barrier. The consumers share one set of queries and take the tiles in turn
// (tile i to consumer i % kConsumers), each with its own product and epilogue, so that several
// tiles are in flight per CTA; two CTAs share an SM.
#pragma once

#include <cuda.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "sm90/indexer/params.h"
#include "sm90/indexer/score.cuh"
#include "sm90/indexer/work.cuh"
#include "sm90/shared/smem.cuh"

namespace dsv4 {

template <int kColumns_>
struct IndexerPagedTraits {
  static constexpr int kColumns = kColumns_;  // (query, head) columns: wgmma's N
  static constexpr int kTileRows = kIndexerPageRows;
  static constexpr int kConsumers = 2;
  static constexpr int kStages = 8;
  static constexpr int kCtasPerSm = 2;
  static constexpr int kProducerThreads = 32;  // one warp, after the consumer warpgroups
  static constexpr int kThreads = 128 * kConsumers + kProducerThreads;
  static constexpr int kAcc = kColumns / 2;
  static constexpr uint32_t kValueBytes = kTileRows * 128;  // a page's fp8 values
  static constexpr uint32_t kScaleBytes = kTileRows * 4;    // then its fp32 scales
  static constexpr uint32_t kStagedBarrier = 1;             // the weights stored (consumers)

  struct SharedStorage {
    alignas(1024) uint8_t q[kColumns][128];
    alignas(1024) uint8_t k[kStages][kTileRows][128];
    alignas(16) float k_scale[kStages][kTileRows];
    alignas(16) float weights[kColumns];  // read as float2
    int block_id[32];                     // the split's pages' blocks
    uint64_t q_full, k_full[kStages], k_empty[kStages];
    int visible;
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
};
template <int kColumns>
using IndexerPagedShared = typename IndexerPagedTraits<kColumns>::SharedStorage;

// The producer warp: the split's block ids (a lane each, clamped into the cache), then lane 0
// loads the queries and streams the pages through the ring.
template <int kColumns>
__device__ __forceinline__ void indexer_paged_produce(IndexerPagedShared<kColumns>& s,
                                                      const CUtensorMap* tmap_q,
                                                      const CUtensorMap* tmap_k,
                                                      const IndexerParams& p,
                                                      const IndexerBlock& blk,
                                                      IndexerTiles tiles, int lane) {
  using T = IndexerPagedTraits<kColumns>;
  const IndexerPagedCache& c = p.paged;
  if (lane < tiles.last - tiles.first) {
    const int64_t at = blk.batch * c.table_stride + tiles.first + lane;
    const int64_t id = c.table_64 ? static_cast<const int64_t*>(c.block_table)[at]
                                  : static_cast<const int32_t*>(c.block_table)[at];
    s.block_id[lane] = static_cast<int>(id < 0 ? 0 : (id >= c.num_blocks ? c.num_blocks - 1 : id));
  }
  __syncwarp();
  if (lane != 0) return;
  ptx::tma_prefetch_descriptor(tmap_q);
  ptx::tma_prefetch_descriptor(tmap_k);
  const uint32_t q_full = ptx::smem_addr(&s.q_full);
  ptx::mbarrier_arrive_expect_tx(q_full, T::kColumns * 128);
  ptx::tma_load_4d(ptx::smem_addr(&s.q[0][0]), tmap_q, q_full, 0,
                   (blk.q0 + blk.first_query) * p.heads, 0, blk.batch);
  for (int i = 0; i < tiles.last - tiles.first; ++i) {
    const int stage = i % T::kStages, block = s.block_id[i];
    ptx::mbarrier_wait(ptx::smem_addr(&s.k_empty[stage]), ((i / T::kStages) & 1) ^ 1);
    const uint32_t full = ptx::smem_addr(&s.k_full[stage]);
    ptx::mbarrier_arrive_expect_tx(full, T::kValueBytes + T::kScaleBytes);
    ptx::tma_load_4d(ptx::smem_addr(&s.k[stage][0][0]), tmap_k, full, 0, 0, 0, block);
    ptx::bulk_load(ptx::smem_addr(&s.k_scale[stage][0]),
                   c.base + block * c.block_stride + T::kValueBytes, T::kScaleBytes, full);
  }
}

// Consumer `wg` of the block's kQ = N / H queries: the weights (all consumers share them), then
// tiles wg, wg + kConsumers, ...: S = K Q^T (64 x N, 128 dims in four k32 steps), the stage
// released once the row scales are read, and the scores stored (score.cuh's epilogue).
template <int kColumns, int kQ>
__device__ __forceinline__ void indexer_paged_consume(IndexerPagedShared<kColumns>& s,
                                                      const IndexerParams& p,
                                                      const IndexerBlock& blk,
                                                      IndexerTiles tiles, int wg) {
  using T = IndexerPagedTraits<kColumns>;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  for (int c = threadIdx.x; c < T::kColumns; c += 128 * T::kConsumers) {
    const int q = blk.first_query + c / p.heads;
    s.weights[c] = q < blk.seq_q
                       ? p.weight_scale * p.weights[(blk.token0 + q) * p.heads + c % p.heads]
                       : 0.f;
  }
  ptx::named_barrier_sync(T::kStagedBarrier, 128 * T::kConsumers);
  float* ws = p.scores + static_cast<int64_t>(blockIdx.y) * p.queries_per_block * p.row_stride;
  const uint32_t q_base = ptx::smem_addr(&s.q[0][0]);
  ptx::mbarrier_wait(ptx::smem_addr(&s.q_full), 0);
  float acc[T::kAcc];
  for (int i = wg; i < tiles.last - tiles.first; i += T::kConsumers) {
    const int stage = i % T::kStages;
    ptx::mbarrier_wait(ptx::smem_addr(&s.k_full[stage]), (i / T::kStages) & 1);
#pragma unroll
    for (int r = 0; r < T::kAcc; ++r) ptx::fence_operand(acc[r]);
    ptx::wgmma_fence();
    const uint32_t k_base = ptx::smem_addr(&s.k[stage][0][0]);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // 32 bytes per k-step
      const uint64_t da = ptx::smem_desc_sw128(k_base + kk * 32, 0, 1024);
      const uint64_t db = ptx::smem_desc_sw128(q_base + kk * 32, 0, 1024);
      ptx::WgmmaSS<T::kColumns, __nv_fp8_e4m3>::run(acc, da, db, kk != 0);
    }
    ptx::wgmma_commit();
    const int r0 = warp * 16 + lane / 4;
    const float f0 = p.sign * s.k_scale[stage][r0], f1 = p.sign * s.k_scale[stage][r0 + 8];
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < T::kAcc; ++r) ptx::fence_operand(acc[r]);
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(ptx::smem_addr(&s.k_empty[stage]));
    indexer_tile_scores<kQ>(acc, s.weights, p, f0, f1, ws, (tiles.first + i) * T::kTileRows + r0);
  }
}

// Grid (splits, chunk_blocks): CTA (x, y) scores pages [x, x + 1) * tiles_per_split of the
// chunk's block y, or exits at once past the block's closed rows.
template <int kColumns>
__global__ void __launch_bounds__(IndexerPagedTraits<kColumns>::kThreads,
                                  IndexerPagedTraits<kColumns>::kCtasPerSm)
    indexer_paged_score_kernel(const __grid_constant__ CUtensorMap tmap_q,
                               const __grid_constant__ CUtensorMap tmap_k,
                               const IndexerParams p) {
  using T = IndexerPagedTraits<kColumns>;
  auto& s = *reinterpret_cast<IndexerPagedShared<kColumns>*>(smem_raw + smem_align_offset());
  IndexerBlock blk;
  if (!indexer_block(p, blockIdx.y, blk)) return;
  if (threadIdx.x < 32) {
    const int visible = indexer_block_visible(p, blk, threadIdx.x);
    if (threadIdx.x == 0) {
      s.visible = visible;
      ptx::mbarrier_init(ptx::smem_addr(&s.q_full), 1);
      for (int st = 0; st < T::kStages; ++st) {
        ptx::mbarrier_init(ptx::smem_addr(&s.k_full[st]), 1);
        ptx::mbarrier_init(ptx::smem_addr(&s.k_empty[st]), 4);  // the consumer's warps
      }
      ptx::fence_barrier_init();
    }
  }
  __syncthreads();
  IndexerTiles tiles;
  tiles.first = blockIdx.x * p.paged.tiles_per_split;
  tiles.last = min(tiles.first + p.paged.tiles_per_split,
                   (s.visible + T::kTileRows - 1) / T::kTileRows);
  if (tiles.first >= tiles.last) return;  // nothing closed in this split
  const int wg = threadIdx.x / 128;
  if (wg == T::kConsumers) {
    indexer_paged_produce<kColumns>(s, &tmap_q, &tmap_k, p, blk, tiles, threadIdx.x % 32);
  } else {
    indexer_per_heads<kColumns / 8>(p.head_levels, [&](auto q) {
      indexer_paged_consume<kColumns, decltype(q)::value>(s, p, blk, tiles, wg);
    });
  }
}

}  // namespace dsv4
