// The sm90 fmha kernel's producer (thread 0 of warpgroup 0): every TMA load, and with
// kPublishWorkTiles the work-tile index of each Q round. kernel.cuh walks the work tiles and
// calls these per tile.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "sm90/fmha/params.h"
#include "sm90/fmha/traits.h"
#include "sm90/fmha/work_tile.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"

namespace dsv4 {

// What the producer's calls share: references to the kernel's values and its Q-round counter.
// The ring position kv_iter is passed by value: the uncut kernel never took its address, and
// taking it changes the code.
template <typename T, bool kVarlen>
struct FmhaProducer {
  typename T::SharedStorage& s;
  const FmhaSm90Params& p;
  const CUtensorMap& tmap_q;
  const CUtensorMap& tmap_k;
  const CUtensorMap& tmap_v;
  const uint32_t& q_full;
  const uint32_t& q_empty;
  int& q_round;  // Q rounds, continued across work tiles

  // A Q round: once the consumers' last QK^T of the previous work tile has landed (so a Q load
  // overlaps their last PV and epilogue), arrive on q_full, with Q's bytes when the tile sees a
  // key (load_q's TMA). With kPublishWorkTiles, write the tile's index first.
  __device__ __forceinline__ void begin_q_round(int work, bool with_q) {
    ptx::mbarrier_wait(q_empty, (q_round & 1) ^ 1);
    if constexpr (T::kPublishWorkTiles) s.work_tile[q_round & 1] = work;
    if (with_q) {
      ptx::mbarrier_arrive_expect_tx(q_full, T::kQBytes);
    } else {
      ptx::mbarrier_arrive(q_full);
    }
    ++q_round;
  }

  // The work tile's query rows from token tok0 on: one box per 64 columns.
  __device__ __forceinline__ void load_q(const WorkTile& w, int tok0) {
    // From smem_raw, not `s` (traits.h, smem_align_offset).
    auto& s = *reinterpret_cast<typename T::SharedStorage*>(smem_raw + smem_align_offset());
    for (int cb = 0; cb < T::kColBlocks; ++cb) {
      ptx::tma_load_4d(ptx::smem_addr(&s.q[cb][0][0]), &tmap_q, q_full, cb * 64,
                       w.q_start + tok0, w.head0, w.batch);
    }
  }

  // K and V of key tile `key_tile` into ring position kv_iter, each once the consumers have
  // released that stage.
  __device__ __forceinline__ void load_kv_tile(const WorkTile& w, int kv_iter, int key_tile,
                                               int kv_head) {
    auto& s = *reinterpret_cast<typename T::SharedStorage*>(smem_raw + smem_align_offset());
    const int stage = kv_iter % T::kStages;
    const uint32_t phase = (kv_iter / T::kStages) & 1;
    const int n0 = key_tile * T::kBlockN;
    const uint32_t k_full = ptx::smem_addr(&s.k_full[stage]);
    ptx::mbarrier_wait(ptx::smem_addr(&s.k_empty[stage]), phase ^ 1);
    ptx::mbarrier_arrive_expect_tx(k_full, T::kTileBytes);
    for (int cb = 0; cb < T::kColBlocks; ++cb) {
      ptx::tma_load_4d(ptx::smem_addr(&s.k[stage][cb][0][0]), &tmap_k, k_full, cb * 64,
                       w.k_start + n0, kv_head, w.batch);
    }
    const uint32_t v_full = ptx::smem_addr(&s.v_full[stage]);
    ptx::mbarrier_wait(ptx::smem_addr(&s.v_empty[stage]), phase ^ 1);
    ptx::mbarrier_arrive_expect_tx(v_full, T::kTileBytes);
    for (int cb = 0; cb < T::kColBlocks; ++cb) {
      ptx::tma_load_4d(ptx::smem_addr(&s.v[stage][cb][0][0]), &tmap_v, v_full, cb * 64,
                       w.k_start + n0, kv_head, w.batch);
    }
  }
};

}  // namespace dsv4
