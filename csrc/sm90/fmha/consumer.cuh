// The sm90 fmha kernel's consumers (warpgroups 1..C, 64 query rows each): the mainloop of a
// work tile. S = Q K^T, the online softmax and O += P V; each warpgroup overlaps the softmax of
// key tile j with the PV wgmma of tile j-1, and the warpgroups take turns issuing their wgmmas
// (pingpong), so one's softmax overlaps another's GEMMs. kernel.cuh runs the key-tile loop.
#pragma once

#include <cstdint>

#include "sm90/shared/key_range.cuh"
#include "sm90/shared/online_softmax.cuh"
#include "sm90/fmha/params.h"
#include "sm90/fmha/traits.h"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/wgmma.cuh"

namespace dsv4 {

// Sets the scores of the keys that this thread's rows {0, 8} cannot see to -inf in the key
// tile starting at n0, if it straddles a boundary. `keys`: the parameters (dense) or the
// sequence's KeyShape. Unpacked, `row` is the query token of the first row; packed, its row in
// the tile, whose token is row % tokens. (Deriving the token from the tile row in both cases
// made ptxas spill in the varlen consumers.)
template <int kBlockN, bool kPacked, typename Keys>
__device__ __forceinline__ void mask_key_tile(const Keys& keys, const KeyTiles& tiles, int row,
                                              int tokens, int col_lane, int n0,
                                              float (&sacc)[kBlockN / 2]) {
  if (!key_tile_needs_mask(keys, tiles, n0, kBlockN)) return;
  int lo[2], hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int pos = kPacked ? tiles.pos_lo + (row + 8 * i) % tokens
                            : row + 8 * i + keys.seqlen_k - keys.seqlen_q;
    const KeySpan span = visible_keys(keys, pos);
    lo[i] = span.lo - n0 - col_lane;
    hi[i] = span.hi - n0 - col_lane;
  }
  if (keys.window_left < 0) {  // without a window every row sees the tile's first keys
    mask_outside<kBlockN, false>(sacc, lo, hi);
  } else {
    mask_outside<kBlockN>(sacc, lo, hi);
  }
}

// A consumer thread's context: the CTA's shared storage and parameters, and the thread's state,
// which lives in the kernel's locals (kernel.cuh) and is held here by reference (as members
// the arrays would compile to other code). The epilogue (epilogue.cuh) reads it too.
template <typename T, bool kVarlen>
struct FmhaConsumer {
  using Element = typename T::Element;
  static constexpr int kHeadDim = T::kHeadDim, kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  static constexpr int kStages = T::kStages;

  typename T::SharedStorage& s;
  const FmhaSm90Params& p;
  float (&o)[kHeadDim / 2];  // the O accumulator
  float (&row_max)[2];       // running max of scale * log2(e) * s
  float (&row_sum)[2];       // this thread's partial sum of 2^(x - row_max)
  KeyTiles& tiles;           // the current work tile's visible key tiles
  KeyShape& shape;           // varlen: its sequence's lengths
  int& token0;               // varlen masks: the query token of this thread's first row
  const int wg;              // the consumer warpgroup, 0..C-1
  const int lane;
  const int col_lane;        // the fragment's first column in each 8-column group
  const int row0;            // this thread's first row of a work tile
  const uint32_t q_base;     // the warpgroup's Q rows
  int& kv_iter;              // ring position and Q rounds, as in the producer
  int& q_round;
  const uint32_t q_empty;

  // The round's work tile: published by the producer (kPublishWorkTiles; read through
  // redux.sync, whose result is in a uniform register: a value loaded from shared memory is
  // per-thread to ptxas, and everything derived from it would be computed per thread), or the
  // static stride's. (stride_work by reference: by value, the dense kernels compile otherwise.)
  __device__ __forceinline__ int published_work(const int& stride_work) const {
    if constexpr (T::kPublishWorkTiles) {
      return __reduce_max_sync(
          0xffffffffu, p.tile_counter == nullptr
                           ? int(blockIdx.x) + q_round * ptx::grid_ctas()
                           : *reinterpret_cast<volatile int*>(&s.work_tile[q_round & 1]));
    } else {
      return stride_work;
    }
  }

  // Pingpong: the warpgroups take turns to issue their wgmmas (round robin through the named
  // barriers kConsumerTurn + wg). Every warpgroup issues the same number of turns (num_tiles + 1
  // per work tile); the last warpgroup pre-arrives for the first, and warpgroup 0 consumes the
  // one arrival left at exit (kernel.cuh).
  __device__ __forceinline__ void wait_turn() const {
    ptx::named_barrier_sync(int(FmhaNamedBarrier::kConsumerTurn) + wg, T::kTurnThreads);
  }
  __device__ __forceinline__ void pass_turn() const {
    ptx::named_barrier_arrive(int(FmhaNamedBarrier::kConsumerTurn) + (wg + 1) % T::kConsumers,
                              T::kTurnThreads);
  }

  // The K/V empty barriers count one arrival per consumer warp: a warp's wgmma reads of a
  // buffer are complete once its lanes have passed the wait_group that they execute together.
  // q_empty keeps one arrival per thread: every lane also reads the published work-tile index
  // (a generic shared-memory read), and one lane's arrival would not order the others' reads
  // before the producer rewrites it (compute-sanitizer racecheck reported exactly that).
  __device__ __forceinline__ void release(uint32_t bar) const {
    if (lane == 0) ptx::mbarrier_arrive(bar);
  }

  // S = Q K^T for the tile in `stage` (issued, not waited on). Each wgmma's descriptors step
  // from the stage's (smem_desc_advance).
  __device__ __forceinline__ void issue_qk(float (&sacc)[kBlockN / 2], int stage) const {
    const uint64_t k_desc = ptx::smem_desc_sw128(ptx::smem_addr(&s.k[stage][0][0][0]), 0, 1024);
#pragma unroll
    for (int cb = 0; cb < T::kColBlocks; ++cb) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // 16 elements = 32 bytes per k-step
        const uint64_t da = ptx::smem_desc_sw128(q_base + cb * kBlockM * 128 + kk * 32, 0, 1024);
        ptx::WgmmaSS<kBlockN, Element>::run(
            sacc, da, ptx::smem_desc_advance(k_desc, cb * kBlockN * 128 + kk * 32),
            (cb | kk) != 0);
      }
    }
  }

  // O += P V for the tile in `stage`; V is read MN-major (head_dim contiguous). `smem`: this
  // context's s, or issue_last_pv's own (traits.h, smem_align_offset).
  __device__ __forceinline__ void issue_pv(typename T::SharedStorage& smem,
                                           const uint32_t (&pfrag)[kBlockN / 16][4],
                                           int stage) const {
    const uint64_t v_desc =
        ptx::smem_desc_sw128(ptx::smem_addr(&smem.v[stage][0][0][0]), kBlockN * 128, 1024);
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t) {
      ptx::WgmmaRS<kHeadDim, Element, 1>::run(o, pfrag[t],
                                              ptx::smem_desc_advance(v_desc, t * 16 * 128), 1);
    }
  }

  // Masks the tile starting at key n0 if `masked` and it straddles a boundary, turns the
  // scores into exponentials (log2 domain; the scale folds into one FMA) and sets the per-row
  // factor that O must be multiplied by once the previous PV has landed.
  __device__ __forceinline__ void softmax(float (&sacc)[kBlockN / 2], int n0,
                                          float (&correction)[2], bool masked) const {
    if (masked) {
      if constexpr (kVarlen) {
        mask_key_tile<kBlockN, false>(shape, tiles, token0, kBlockM, col_lane, n0, sacc);
      } else {
        mask_key_tile<kBlockN, true>(p, tiles, row0, p.pack_tokens, col_lane, n0, sacc);
      }
    }
    online_softmax_update<kBlockN>(sacc, p.scale_log2, row_max, row_sum, correction);
  }

  // The work tile's first key tile: QK^T alone, its softmax (O is still 0: no rescale) and P.
  __device__ __forceinline__ void first_tile(int num_tiles, float (&sacc)[kBlockN / 2],
                                             uint32_t (&pfrag)[kBlockN / 16][4],
                                             float (&correction)[2]) {
    // From smem_raw, not `s` (traits.h, smem_align_offset).
    auto& s = *reinterpret_cast<typename T::SharedStorage*>(smem_raw + smem_align_offset());
    const int first = kv_iter % kStages;
    ptx::mbarrier_wait(ptx::smem_addr(&s.k_full[first]), (kv_iter / kStages) & 1);
    wait_turn();
    ptx::wgmma_fence();
    issue_qk(sacc, first);
    ptx::wgmma_commit();
    pass_turn();
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) ptx::fence_operand(sacc[i]);
    release(ptx::smem_addr(&s.k_empty[first]));
    if (num_tiles == 1) ptx::mbarrier_arrive(q_empty);  // last read of Q in this work tile
    softmax(sacc, tiles.first * kBlockN, correction, true);
    scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
  }

  // One steady-state key tile: QK^T of tile it and PV of tile it-1 issued, then the softmax
  // of tile it. `masked`: whether the tile may straddle a boundary (tested at run time).
  __device__ __forceinline__ void step(int it, int num_tiles, bool masked,
                                       float (&sacc)[kBlockN / 2],
                                       uint32_t (&pfrag)[kBlockN / 16][4],
                                       float (&correction)[2]) {
    const int cur = kv_iter + it;
    const int stage = cur % kStages, prev = (cur - 1) % kStages;
    const uint32_t phase = (cur / kStages) & 1, prev_phase = ((cur - 1) / kStages) & 1;
    if (wg == 0) ptx::mbarrier_wait(ptx::smem_addr(&s.k_full[stage]), phase);
    wait_turn();
    ptx::wgmma_fence();
    issue_qk(sacc, stage);
    ptx::wgmma_commit();
    if (wg == 0) ptx::mbarrier_wait(ptx::smem_addr(&s.v_full[prev]), prev_phase);
    ptx::wgmma_fence();  // without it ptxas serializes the wgmmas around the wait (C7520)
    issue_pv(s, pfrag, prev);
    ptx::wgmma_commit();
    pass_turn();
    ptx::wgmma_wait<1>();  // QK^T of tile it has landed; PV of tile it-1 may still run
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) ptx::fence_operand(sacc[i]);
    release(ptx::smem_addr(&s.k_empty[stage]));
    if (it == num_tiles - 1) ptx::mbarrier_arrive(q_empty);  // last read of Q
    softmax(sacc, (tiles.first + it) * kBlockN, correction, masked);
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) ptx::fence_operand(o[i]);
    release(ptx::smem_addr(&s.v_empty[prev]));
    if constexpr (T::kConvertBeforeRescale) scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
    rescale_rows_unless_one<kHeadDim>(o, correction);
    if constexpr (!T::kConvertBeforeRescale) {
      scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
    }
  }

  // PV of the work tile's last key tile, issued; the epilogue waits for it.
  __device__ __forceinline__ void issue_last_pv(int num_tiles,
                                                const uint32_t (&pfrag)[kBlockN / 16][4]) {
    // From smem_raw (traits.h), and passed on to issue_pv: with one use the address would fold
    // differently.
    auto& s = *reinterpret_cast<typename T::SharedStorage*>(smem_raw + smem_align_offset());
    const int last_iter = kv_iter + num_tiles - 1, last = last_iter % kStages;
    ptx::mbarrier_wait(ptx::smem_addr(&s.v_full[last]), (last_iter / kStages) & 1);
    wait_turn();
    ptx::wgmma_fence();
    issue_pv(s, pfrag, last);
    ptx::wgmma_commit();
    pass_turn();
  }
};

}  // namespace dsv4
