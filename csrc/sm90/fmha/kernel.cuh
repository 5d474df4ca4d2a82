// sm90a fmha forward: TMA loads, an mbarrier pipeline, wgmma and warp specialization.
//
// Each CTA walks work tiles (a query tile of one (batch, head), or with packed GQA the query
// heads of one KV head, tokens x heads in the rows; work_tile.cuh) and computes each against
// every visible key tile. The producer thread picks the CTA's next work tile
// (sm90/shared/tile_scheduler.cuh: a static stride, or a global counter for the launcher's
// dynamic grid, fmha_grid). The kernels with kPublishWorkTiles publish each index with its Q
// load (the counter's draws are known to the producer alone); the others' consumers follow the
// static stride themselves. Either way the consumers decode each tile themselves.
// Roles (128 threads per warpgroup):
//   warpgroup 0, thread 0  producer (producer.cuh): issues every TMA load, then idles (24
//                          registers).
//   warpgroups 1..C        consumers (consumer.cuh, epilogue.cuh; C = 2, or 3 at head_dim 64),
//                          64 query rows each, with 240 (C = 2) or 160 (C = 3) registers:
//                          S = Q K^T (wgmma, both operands in shared memory), online softmax in
//                          registers (its reference max raised lazily, so most tiles skip O's
//                          rescale), O += P V (wgmma, P from registers). Each warpgroup overlaps
//                          the softmax of tile j with the PV wgmma of tile j-1 (QK^T of tile j
//                          is issued first, then PV of j-1; wait_group 1 releases S_j alone),
//                          and the warpgroups take turns issuing wgmmas (pingpong, named
//                          barriers), so one's softmax overlaps another's GEMMs.
// Shared memory, the barriers and their protocol: traits.h.
//
// Varlen (the kVarlen instantiations): the tensor maps see the packed tensors as one batch and
// each work tile takes its sequence's rows and lengths from a schedule built on the device
// (csrc/sm90/shared/varlen_schedule.cuh); a tile past its sequence's end loads the next one's
// rows, which the masks exclude and the epilogue never stores.
// Split-KV (dense): when the work tiles cannot fill the SMs, each one's key tiles are cut into
// num_splits ranges (work = tile * num_splits + split); a split writes fp32 partial rows and
// their lse, and the combine kernel (csrc/sm90/shared/split_kv_combine.cuh) folds in the sink.
// Masking: key tiles that no row of the CTA can see (causal, window, past Sk) are never
// loaded; only tiles that straddle a boundary are masked element by element (at head_dim >=
// 128 the tiles every row sees whole run a loop of their own, without the per-tile test).
// Rows that see nothing end with out = 0 and lse = -inf, or the sink-only value when a sink
// is given.
//
// The cut into roles keeps the machine code of the single-body kernel it came from (SASS
// identical): which values live in this body, which the role functions take by reference and
// which addresses they derive themselves all follow from that; the notes at each say so.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "sm90/shared/key_range.cuh"
#include "sm90/shared/tile_scheduler.cuh"
#include "sm90/fmha/consumer.cuh"
#include "sm90/fmha/epilogue.cuh"
#include "sm90/fmha/params.h"
#include "sm90/fmha/producer.cuh"
#include "sm90/fmha/traits.h"
#include "sm90/fmha/work_tile.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"

namespace dsv4 {

template <typename Element, int kHeadDim, int kBlockN_, bool kVarlen>
__global__ void __launch_bounds__(FmhaSm90Traits<Element, kHeadDim, kBlockN_>::kThreads, 1)
    fmha_sm90_kernel(const __grid_constant__ CUtensorMap tmap_q,
                     const __grid_constant__ CUtensorMap tmap_k,
                     const __grid_constant__ CUtensorMap tmap_v, const FmhaSm90Params p) {
  using T = FmhaSm90Traits<Element, kHeadDim, kBlockN_>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  constexpr bool kPublish = T::kPublishWorkTiles;
  const float neg_inf = __int_as_float(0xff800000);

  auto& s = *reinterpret_cast<typename T::SharedStorage*>(smem_raw + smem_align_offset());
  const uint32_t q_full = ptx::smem_addr(&s.q_full), q_empty = ptx::smem_addr(&s.q_empty);
  // A split call's combine follows by programmatic dependent launch: it may take the SMs this
  // grid leaves from now on, and waits for this grid's partials itself.
  ptx::griddep_launch_dependents();
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(q_full, T::kQFullArrivals);
    ptx::mbarrier_init(q_empty, T::kQEmptyArrivals);
    for (int i = 0; i < T::kStages; ++i) {
      ptx::mbarrier_init(ptx::smem_addr(&s.k_full[i]), T::kFullArrivals);
      ptx::mbarrier_init(ptx::smem_addr(&s.v_full[i]), T::kFullArrivals);
      ptx::mbarrier_init(ptx::smem_addr(&s.k_empty[i]), T::kEmptyArrivals);
      ptx::mbarrier_init(ptx::smem_addr(&s.v_empty[i]), T::kEmptyArrivals);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x != 0) return;
    ptx::tma_prefetch_descriptor(&tmap_q);
    ptx::tma_prefetch_descriptor(&tmap_k);
    ptx::tma_prefetch_descriptor(&tmap_v);
    int kv_iter = 0, q_round = 0;  // ring position and Q rounds, continued across work tiles
    FmhaProducer<T, kVarlen> producer{s, p, tmap_q, tmap_k, tmap_v, q_full, q_empty, q_round};
    int work = blockIdx.x;
    while (work < p.num_work) {
      // Drawn now, used once this tile's loads are issued: an atomic's latency hides.
      const int next = kPublish ? next_work_tile(p.tile_counter, work) : work + ptx::grid_ctas();
      const WorkTile w = decode_tile<kVarlen>(p, work);
      const int tokens = tile_tokens<kVarlen, kBlockM>(p);
      const int tok0 = w.m_block * tokens;
      const KeyTiles tiles =
          kVarlen ? visible_key_tiles(w.shape, tok0, tokens, kBlockN)
                  : split_tiles(visible_key_tiles(p, tok0, tokens, kBlockN), w.split, p.num_splits);
      const int num_tiles = tiles.end - tiles.first;
      // A tile that sees no key loads nothing (its consumers write the empty rows); with
      // kPublish it still takes a round, to publish its index.
      if (kPublish || num_tiles > 0) producer.begin_q_round(work, num_tiles > 0);
      work = next;
      if (num_tiles == 0) continue;
      producer.load_q(w, tok0);
      const int kv_head = w.head0 / p.group;
      for (int it = 0; it < num_tiles; ++it, ++kv_iter) {
        producer.load_kv_tile(w, kv_iter, tiles.first + it, kv_head);
      }
    }
    if constexpr (kPublish) producer.begin_q_round(work, false);  // past the last: the loop ends
    return;
  }

  ptx::setmaxnreg_inc<T::kConsumerRegs>();
  // Broadcast from lane 0, which ptxas treats as warp-uniform: the Q descriptors, barrier
  // addresses and ring arithmetic then stay in uniform registers (SASS per mask-free key tile at
  // head_dim 128 / 128 keys: 561 -> 488 instructions, 17 R2UR -> 0; FlashAttention-3 does the
  // same and runs 469).
  const int wg = __shfl_sync(0xffffffff, warpgroup - 1, 0);
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  // Accumulator fragment: this thread holds rows r and r + 8 of the warpgroup's 64 rows, and
  // in each 8-column group j the columns 8j + 2 (lane % 4) + {0, 1}:
  //   acc[4j + 2i + c] = (row r + 8i, col 8j + 2 (lane % 4) + c).
  const int col_lane = 2 * (lane % 4);
  const int row0 = wg * 64 + warp * 16 + lane / 4;  // this thread's first row of a work tile
  // The consumer's state across work tiles and the epilogue's rows live here, FmhaConsumer and
  // fmha_epilogue take them by reference (as its members or the epilogue's locals, the
  // compiler lays them out otherwise and the SASS changes).
  KeyTiles tiles{};
  KeyShape shape{};
  int token0 = 0;
  float o[kHeadDim / 2];
  float row_max[2];
  float row_sum[2];
  int token[2], head[2];
  const uint32_t q_base = ptx::smem_addr(&s.q[0][wg * 64][0]);
  int kv_iter = 0, q_round = 0;
  FmhaConsumer<T, kVarlen> consumer{
      s, p, o, row_max, row_sum, tiles, shape, token0,  // the state above, by reference
      wg, lane, col_lane, row0, q_base, kv_iter, q_round, q_empty};
  if (wg == T::kConsumers - 1) consumer.pass_turn();  // warpgroup 0 takes the first turn
  // The round's work tile is read again for the epilogue rather than held in a register through
  // the mainloop: with kPublish its slot is rewritten two rounds later, after this epilogue.
  for (int stride_work = blockIdx.x;; stride_work += ptx::grid_ctas(), q_round += kPublish) {
    if constexpr (kPublish) ptx::mbarrier_wait(q_full, q_round & 1);
    if (consumer.published_work(stride_work) >= p.num_work) break;
    {
      const WorkTile w = decode_tile<kVarlen>(p, consumer.published_work(stride_work));
      const int tokens = tile_tokens<kVarlen, kBlockM>(p);
      shape = w.shape;
      token0 = w.m_block * kBlockM + row0;
      // The producer derives the same tiles (its split of them) for this work tile.
      tiles = kVarlen ? visible_key_tiles(shape, w.m_block * tokens, tokens, kBlockN)
                      : split_tiles(visible_key_tiles(p, w.m_block * tokens, tokens, kBlockN),
                                    w.split, p.num_splits);
    }
    const int num_tiles = tiles.end - tiles.first;
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
    row_max[0] = row_max[1] = neg_inf;
    row_sum[0] = row_sum[1] = 0.f;

    if (kPublish && num_tiles == 0) ptx::mbarrier_arrive(q_empty);  // Q was not loaded
    if (num_tiles > 0) {
      if constexpr (!kPublish) ptx::mbarrier_wait(q_full, q_round & 1);
      float sacc[kBlockN / 2];
      uint32_t pfrag[kBlockN / 16][4];
      float correction[2];
      consumer.first_tile(num_tiles, sacc, pfrag, correction);
      int it = 1;
      if constexpr (T::kSplitMaskLoop) {  // the tiles every row sees whole: no mask test
        const KeySpan free = kVarlen ? mask_free_key_tiles(shape, tiles, kBlockN)
                                     : mask_free_key_tiles(p, tiles, kBlockN);
        const int free_lo = max(free.lo - tiles.first, 1);
        const int free_hi = max(free.hi - tiles.first, free_lo);
        for (; it < free_lo; ++it) consumer.step(it, num_tiles, true, sacc, pfrag, correction);
        for (; it < free_hi; ++it) consumer.step(it, num_tiles, false, sacc, pfrag, correction);
      }
      for (; it < num_tiles; ++it) consumer.step(it, num_tiles, true, sacc, pfrag, correction);
      consumer.issue_last_pv(num_tiles, pfrag);
      kv_iter += num_tiles;
      if constexpr (!kPublish) ++q_round;
    }
    fmha_epilogue(consumer, consumer.published_work(stride_work), num_tiles, s.v_empty, token,
                  head);
  }
  if (wg == 0) consumer.wait_turn();  // the last hand-over (or the pre-arrival) is still open
}

}  // namespace dsv4
